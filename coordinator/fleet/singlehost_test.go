package fleet

import (
	"testing"

	"heft/shared/wire"
)

// In a fleet declared single-host, an engine offered at loopback is
// reachable by every gateway: no not_routable, in either of its forms.
// Without the setting the same engines are warned about (see
// TestViewsCarryAddressAndCap).
func TestSingleHostRaisesNoNotRoutable(t *testing.T) {
	for _, single := range []bool{false, true} {
		cfg := DefaultConfig()
		cfg.SingleHost = single
		h := newHarnessWith(t, cfg, newMemStore(), &clock{t: t0})
		local := engine("local", "http://127.0.0.1:8001", "m")
		local.Listen = []string{"127.0.0.1:8001"}
		chosen := engine("chosen", "http://127.0.0.1:8002", "m")
		chosen.AdvertiseURL = "http://127.0.0.1:8002"
		h.admit("n1", local, 200)
		h.admit("n2", chosen, 200)
		for _, id := range []string{"local", "chosen"} {
			_, warned := warning(h.worker(id), wire.CodeNotRoutable)
			if warned == single {
				t.Errorf("single_host=%v: %s warned=%v, warnings %+v", single, id, warned, h.worker(id).Warnings)
			}
		}
	}
}
