package fleet

import (
	"time"

	"heft/shared/wire"
)

// Store is where the fleet keeps what must survive a restart; the fleet
// owns its vocabulary, and package store implements it with bbolt
// (*store.Bolt). Every write returns only once it is durable.
type Store interface {
	Load() (State, error)
	SavePin(id string, weight float64) error
	DeletePin(id string) error
	// SavePrefillPin and DeletePrefillPin keep the prefill weight's pins,
	// apart from the decode weight's.
	SavePrefillPin(id string, weight float64) error
	DeletePrefillPin(id string) error
	SaveDecision(id, decision string) error
	DeleteDecision(id string) error
	// SaveMeasurement makes m its key's latest measurement and appends
	// HistoryEntry(m) to the key's history, keeping historyLen entries.
	SaveMeasurement(m wire.Measurement, historyLen int) error
	SaveWorker(r WorkerRecord) error
	// DeleteWorker and DeleteMeasurements forget a capacity key's worker
	// record, and its latest measurement and history. Deleting what is
	// not there is not an error.
	DeleteWorker(id string) error
	DeleteMeasurements(key string) error
}

// Decisions an admin can record for a worker.
const (
	DecisionAdmit = "admit"
	DecisionHold  = "hold"
	// DecisionHoldBelowFloor is a hold the admin said may take its model
	// below heft-sync's floor (view.Worker.BelowFloor): the gateways drop
	// the worker even when it is the model's last.
	DecisionHoldBelowFloor = "hold_below_floor"
)

// isHold says whether a decision holds the worker.
func isHold(d string) bool { return d == DecisionHold || d == DecisionHoldBelowFloor }

// validDecision says whether a stored decision is one the fleet knows.
func validDecision(d string) bool { return d == DecisionAdmit || isHold(d) }

// State is everything a Store holds. History lists are oldest first.
type State struct {
	Pins        map[string]float64
	PrefillPins map[string]float64
	Decisions   map[string]string
	Latest      map[string]wire.Measurement
	History     map[string][]wire.Measurement
	Workers     map[string]WorkerRecord
	KeyTombs    map[string]KeyTomb // a TombStore's; nil from another
}

// WorkerRecord is what the coordinator last knew about a worker, so that
// after a restart the fleet can show it before its agent reconnects. Its
// JSON form is what the store writes.
type WorkerRecord struct {
	ID            string      `json:"id"`
	Node          string      `json:"node"`
	Model         string      `json:"model"`
	Engine        string      `json:"engine"`
	URL           string      `json:"url"`
	EngineVersion string      `json:"engine_version,omitempty"`
	LaunchArgs    []string    `json:"launch_args,omitempty"`
	Ranks         []wire.Rank `json:"ranks,omitempty"`
	MaxModelLen   int64       `json:"max_model_len,omitempty"`
	FirstSeen     time.Time   `json:"first_seen"`
	LastSeen      time.Time   `json:"last_seen"`

	// ExpectedRanks, Complete and MissingRanks say whether Ranks is the
	// whole set (wire.Engine's), so a restored worker is judged as before.
	ExpectedRanks int   `json:"expected_ranks,omitempty"`
	Complete      *bool `json:"complete,omitempty"`
	MissingRanks  []int `json:"missing_ranks,omitempty"`

	// EngineDown: the agent's last word was that the engine is not ready
	// or cannot be read, so a restart does not bring the worker back into
	// the weights before its agent says otherwise.
	EngineDown bool `json:"engine_down,omitempty"`
	// AgentGone is when the worker's agent disconnected; nil while it was
	// connected. A restart keeps counting the grace and the stale weight's
	// TTL from it, so a worker that was offline stays offline.
	AgentGone *time.Time `json:"agent_gone,omitempty"`
	// Pace is the worker's pace reference and rescale (pace.go), so a
	// restart keeps a slowdown found while the engine served.
	Pace *PaceRecord `json:"pace,omitempty"`
}
