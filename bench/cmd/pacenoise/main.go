// Command pacenoise prints how noisy windowed pace readings are on the
// real engine logs in testdata/pace-wild (see package bench/pacenoise).
//
//	go run ./bench/cmd/pacenoise [--logs testdata/pace-wild]
package main

import (
	"flag"
	"fmt"
	"os"

	"heft/bench/pacenoise"
)

func main() {
	logs := flag.String("logs", "testdata/pace-wild", "folder of *.log engine stats excerpts")
	flag.Parse()
	srcs, err := pacenoise.ReadDir(*logs)
	if err == nil {
		err = pacenoise.WriteMarkdown(os.Stdout, srcs, pacenoise.Analyse(srcs))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "pacenoise:", err)
		os.Exit(1)
	}
}
