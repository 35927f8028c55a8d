package engine

import (
	_ "github.com/hashicorp/go-hclog"
	_ "github.com/prometheus/common/expfmt"
	_ "github.com/prometheus/common/model"
	_ "github.com/shirou/gopsutil/v4/net"
	_ "github.com/shirou/gopsutil/v4/process"
)
