package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"heft/bench/loadgen"
)

// routingChecks are the area's two failure checks, run once under load
// through every heft-driven policy at the same time: the fast worker's
// agent is killed (its engine keeps serving, so only heft can stop the
// traffic), then the coordinator is killed.
type routingChecks struct {
	Load    float64 // total offered load, fraction of the fleet's capacity
	Offline []offlineResult
	Frozen  []frozenResult
	Loads   []loadgen.Result // per policy, in Offline's order
	Err     error
}

// offlineResult is what one policy's gateway did after the agent died.
type offlineResult struct {
	Policy policy
	// LastRequest runs from the kill to the last request sent to the
	// worker (negative: none after the kill); AfterKill counts those sent
	// after it.
	LastRequest time.Duration
	AfterKill   int
	// Drained runs from the kill to the first time the gateway was seen
	// not serving the worker (its state polled every 25 ms); 0 if never.
	Drained time.Duration
}

// judged is the later of the two: the time the worker may have taken new
// requests for.
func (o offlineResult) judged() time.Duration {
	if o.Drained == 0 {
		return 0
	}
	return max(o.LastRequest, o.Drained)
}

// frozenResult is one gateway's state around the coordinator's death.
type frozenResult struct {
	Policy        policy
	Before, After string
}

func (r frozenResult) unchanged() bool { return r.Before != "" && r.Before == r.After }

// checkLoad is the total offered load during the checks: low enough that
// the fleet without its fast worker still keeps up.
const checkLoad = 0.24

// runChecks runs the offline and the coordinator-kill checks.
func (f *routingFleet) runChecks(ctx context.Context, capacity float64, plan routingPlan) *routingChecks {
	var heft []policy
	for _, p := range plan.Policies {
		if p.Weights == weightsHeft {
			heft = append(heft, p)
		}
	}
	ch := &routingChecks{Load: checkLoad}
	if len(heft) == 0 {
		ch.Err = errors.New("no heft-driven policy in the plan")
		return ch
	}
	if err := f.waitIdle(ctx); err != nil {
		ch.Err = err
		return ch
	}
	fastAddr := f.simAddr(routeFast)
	ch.Loads = make([]loadgen.Result, len(heft))
	lctx, cancelLoad := context.WithCancel(ctx)
	defer cancelLoad()
	var wg sync.WaitGroup
	for i, p := range heft {
		cfg := loadgen.Config{URL: f.frontURL(p), Model: benchModel, Tokens: plan.Tokens, Drain: plan.Drain,
			Rate: checkLoad / float64(len(heft)) * capacity / float64(plan.Tokens), Duration: 20 * time.Second,
			MaxInFlight: 1024, Seed: 99 + uint64(i), Client: f.client, KeepRequests: true}
		wg.Go(func() { ch.Loads[i], _ = loadgen.Run(lctx, cfg) })
	}
	finish := func() { wg.Wait() }

	// The agent of the fast worker dies; its engine keeps serving.
	if !sleepCtx(ctx, 3*time.Second) {
		cancelLoad()
		finish()
		ch.Err = ctx.Err()
		return ch
	}
	agent := f.agents[routeFast]
	killedAt := time.Now()
	if err := agent.cmd.Process.Kill(); err != nil {
		ch.Err = fmt.Errorf("kill the fast worker's agent: %w", err)
	}
	<-agent.exited
	ch.Offline = make([]offlineResult, len(heft))
	for i, p := range heft {
		ch.Offline[i].Policy = p
	}
	deadline := killedAt.Add(routeOfflineGrace + 15*time.Second)
	for pending := len(heft); pending > 0 && time.Now().Before(deadline) && ctx.Err() == nil; {
		for i := range ch.Offline {
			o := &ch.Offline[i]
			if o.Drained != 0 {
				continue
			}
			if on, err := f.serves(ctx, o.Policy, fastAddr); err == nil && !on {
				o.Drained = time.Since(killedAt)
				pending--
			}
		}
		time.Sleep(25 * time.Millisecond)
	}

	// Then the coordinator dies: heft-sync must keep every gateway as it is.
	ch.Frozen = make([]frozenResult, len(heft))
	for i, p := range heft {
		ch.Frozen[i].Policy = p
		ch.Frozen[i].Before, _ = f.gatewayState(ctx, p)
	}
	applied := func() float64 {
		m, err := scrape(ctx, f.syncURL+"/metrics")
		if err != nil {
			return -1
		}
		return m["heft_sync_applies_total"]
	}
	before := applied()
	if err := f.co.cmd.Process.Kill(); err != nil {
		ch.Err = errors.Join(ch.Err, fmt.Errorf("kill the coordinator: %w", err))
	}
	<-f.co.exited
	// Three resyncs of every target (each re-applies the last state) with
	// the coordinator gone.
	want := before + float64(3*len(heft))
	for deadline := time.Now().Add(10*routeResync + 10*time.Second); applied() < want && time.Now().Before(deadline) && ctx.Err() == nil; {
		time.Sleep(50 * time.Millisecond)
	}
	if got := applied(); got < want {
		ch.Err = errors.Join(ch.Err, fmt.Errorf("heft-sync applied %g times while the coordinator was down, want %g", got-before, want-before))
	}
	for i, p := range heft {
		ch.Frozen[i].After, _ = f.gatewayState(ctx, p)
	}
	finish()

	for i := range heft {
		o := &ch.Offline[i]
		o.LastRequest = -time.Hour
		for _, r := range ch.Loads[i].Requests {
			if f.workerAt(r.Backend) != routeFast {
				continue
			}
			if d := r.Start.Sub(killedAt); d > o.LastRequest {
				o.LastRequest = d
			}
			if r.Start.After(killedAt) {
				o.AfterKill++
			}
		}
		ch.Loads[i].Requests = nil // kept only for this
	}
	return ch
}

// sleepCtx waits d unless ctx ends first; it reports whether it waited.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
