// Package fleet is the coordinator's model of its workers: which engines
// exist, what each was measured to carry, whether it is admitted into its
// model's weight table, what is wrong with it, and when to measure it
// again. It does no I/O of its own: agent events and admin actions come in
// as method calls, messages for agents go out as Actions, and state is kept
// through the Store interface. A Fleet is safe for concurrent use.
//
// # Workers
//
// A worker is one engine endpoint, identified by the capacity key the agent
// computes (node + engine kind + model + launch arguments). An engine
// restarted with other launch arguments therefore arrives as a new worker
// and is measured; the old one disappears from the node's snapshot and is
// dropped from the fleet (its measurement stays cached, so switching back
// costs no burst). An engine the agent lists without a capacity key (it
// could not be read, so its model is unknown) updates the readiness of the
// node's worker at the same URL, or, if there is none, shows as a
// placeholder worker with the ID "unkeyed:<node>:<url>" that is never
// measured, pinned or admitted. An offline worker not seen for ForgetAfter
// (24h) is dropped, and its stored record deleted; its pins and decisions
// stay stored for the day it returns.
//
// # Whose worker it is
//
// A capacity key belongs to the node that first listed it (the key is a
// hash of the node name among the rest, so no other node can list it
// honestly). While the fleet remembers the key (a worker, or cached
// measurements), another node listing it is refused for that engine,
// logged and counted (ClaimsRefused), and nothing of the owner's changes.
// Once the owner's worker is forgotten and its measurement is older than
// CacheTTL, the key is released, but its owner is kept in a tomb
// (keytombs.go): for KeyTombTTL (30 days) another node listing it is still
// refused, and the owner takes it back on its return, so a host away for
// more than a day does not find its engine squatted. An admin's release
// of the owner's name (ForgetNode) ends its tombs; a node that lists the
// key then is measured afresh. The server has already checked that a
// connection may speak for its node name (package nodes).
//
// # Bounds on what agents send
//
// A node's capacity keys (its workers and the keys it has cached
// measurements of) are at most MaxKeysPerNode; a new key past it forgets
// the one the node listed least recently (KeysEvicted). Measurements are
// cut to what the fleet keeps (16 problems of 512 bytes, 16 clock reasons,
// texts of 512 bytes; MeasurementsCut), and their history keeps only the
// numbers (HistoryEntry). Cached measurements of a key no agent lists are
// dropped once older than CacheTTL. A node with neither a connection nor
// a worker is forgotten. A worker shows its engine's own GPUs: those it
// lists, or the host's when it is the host's only engine, never the
// host's whole set once per engine.
//
// # States, in the order they are decided
//
//   - stale or offline: the worker's agent has been disconnected for
//     OfflineGrace or longer. The agent being gone says nothing about the
//     engine, so a worker whose other rules below make it admitted stays
//     in the weights at its last weight as stale (agent_offline, warning,
//     saying since when and until when) until StaleWeightTTL (CacheTTL by
//     default) after the disconnect; the gateways' own health checks take
//     a dead engine out meanwhile. Any other worker (its agent last said
//     the engine was not ready or could not be read, it was held or not
//     yet measured), and a stale one once the TTL is out, is offline
//     (agent_offline, critical). Within the grace a worker keeps the state
//     its last facts give. The worker record keeps whether the engine was
//     down and when the agent left, so a coordinator restart neither
//     revives an engine known down nor restarts a stale weight's TTL; a
//     worker whose agent was connected when the coordinator stopped counts
//     as gone from the restart. After a restart the stored workers (the
//     last one seen per node and URL) keep their weights while the agents
//     reconnect. An agent is back only once a snapshot arrives on its
//     connection (the server has refused the invalid ones): a hello alone,
//     or an agent looping on hellos and refused snapshots, moves neither
//     the grace nor the TTL, which run from when it last left; a
//     connection that replaces a reporting one counts as leaving then.
//   - held by an admin "hold": overrides everything below.
//   - pending: the engine is not ready, or cannot be read
//     (engine_unreachable, critical, when the agent gives an error).
//   - measuring: ready, but no measurement yet; a registration probe is
//     requested.
//   - held: the newest measurement is not valid (wire.Measurement.Valid):
//     probe_failed or probe_incomplete_output, critical. A fresh probe is
//     requested FailRetry later; a valid newer measurement replaces it. An
//     admin "admit" does not override this: there is no number to weight.
//   - held: the newest measurement is implausible (implausible_measurement,
//     critical), unless an admin admitted the worker: the agent's probe
//     flagged a stream faster than any engine's, or its throughput is above
//     MaxTPSPerGPU per GPU of the engine or MaxStreamTPS per concurrent
//     request. The verdict is stored with the measurement.
//   - held: the data-parallel pools are uneven below Thresholds.PoolHold
//     (dp_pool_imbalance, critical), unless an admin admitted the worker.
//     Below PoolWarn the same code is a warning and the worker is admitted.
//   - admitted.
//
// Warnings from the agent's facts (foreign_gpu_process, gpu_clock_low,
// gpu_throttled, context_exceeds_pool, a warning-level
// probe_incomplete_output from an engine that cannot be told an exact
// length, prefill_failed from a failed prefill burst, and the pool warnings
// below) do not hold a worker. Every warning carries Since, the first time its code was seen
// on the worker without a break; it is stable across snapshots.
//
// # Pools
//
// The pool rules are shared/health's (PoolFindings), the same as
// heft-agent inspect's. A set of pools is judged only when it is whole:
//
//   - The agent says how many data-parallel ranks the engine runs
//     (Engine.ExpectedRanks: the most its launch arguments, its log's rank
//     markers or its pools show) and whether each has a pool
//     (Engine.Complete). An agent that does not say (Complete absent) is
//     believed: its ranks are all there are, as before.
//   - Complete false with some pools (pools_incomplete, warning): a rank
//     has printed none yet, failed before sizing its KV cache, or runs on
//     another node, where it is real. The worker is not held for it and
//     gets no pool_min_over_max (null); an imbalance already visible among
//     the ranks found is dp_pool_imbalance at warning severity, naming the
//     rank, since the missing ranks can only make it more uneven. Once the
//     set is whole the hold rule above applies.
//   - No pool at all (pools_unknown, warning) where one matters: the
//     engine's log is configured but cannot be read (Engine.LogSource.Error,
//     whatever the readiness), or a ready engine runs two or more ranks (by
//     ExpectedRanks, or data_parallel_size in its launch arguments from an
//     older agent) and neither its log nor its endpoints gave a pool. A
//     single-rank engine without pools has nothing to be uneven with.
//   - A multi-node data-parallel deployment (deployment.go): workers of
//     one model whose launch arguments name the same data-parallel address
//     (vLLM data_parallel_address:data_parallel_rpc_port or
//     master_addr:master_port, SGLang dist_init_addr) with a local size,
//     start rank, headless flag or node rank name one deployment. Each
//     node's worker is judged, held and shown on the union of its ranks
//     and those of the workers it joins (dp_deployment, info, names the
//     nodes and their ranks). Any node may name any address, so a worker
//     joins another node's ranks only where its own launch arguments
//     leave room for them: same data_parallel_size, ranks inside it and
//     inside the claimant's own range, and none that a worker joined
//     before claims (the worker itself first, then a head whose gateway
//     address, checked as its node's, is on the data-parallel host, then
//     by first seen). A node naming the deployment later can neither hold
//     its workers nor lift their hold. Workers not joined, and ranks no
//     node has reported, are dp_deployment_mismatch (warning), naming the
//     nodes, after DeploymentGrace saying the node has not reported
//     rather than not yet.
//   - The log's pools against the engine's own per-rank pools where those
//     are truthful (Engine.PoolCheck: SGLang's /metrics, /v1/loads,
//     /server_info; never vLLM's cache_config_info, a sum over ranks):
//     a rank differing by more than 1% is pools_disagree (warning), naming
//     both figures. The worker is judged on the log's pools.
//
// # Weights
//
// Only admitted workers get a weight. A worker whose throughput is more
// than ImplausibleFactor (4) × its model's median, with at least three
// workers of the model measured, is held as implausible (critical) until
// the median catches up with it or an admin admits it; it stays in the
// median, which one outlier cannot move. Weight = throughput / the median
// throughput of the admitted workers of the same model, the worker itself
// included (the mean of the two middle values for an even count), clamped
// to [WeightMin, WeightMax]; weight_clamped (warning) says so when the
// clamp changed the number. A pinned weight replaces the computed one (and
// then no clamp warning is shown, since the clamp did not set the number);
// pins survive restarts until cleared, and a pin does not admit a held
// worker. Numbers are validated on every way in, and a weight that is not
// a finite number above zero never reaches the table.
//
// The prefill weight is the same rule over the prefill burst: an admitted
// worker whose newest measurement has a valid prefill part
// (wire.Measurement.PrefillValid) counts its prefill throughput in its
// model's median prefill throughput (over those workers only), and its
// prefill weight is its prefill throughput over that median, clamped to
// the same range (a clamp of either weight is one weight_clamped warning
// that says which). It has pins of its own (PinKind, UnpinKind with
// view.WeightPrefill), stored apart from the decode pins and restored the
// same way. A worker whose prefill part failed keeps its decode weight
// and has no prefill weight (prefill_failed); a measurement without a
// prefill part (an agent told not to send it) gives none either, and the
// fleet never asks for a probe only to get one. WeightsOf serves either
// table.
//
// What a worker can hold, max_context_tokens, is the smaller of its
// engine's maximum model length and its smallest data-parallel rank's KV
// pool (wire.Engine.MaxContextTokens): requests are dealt to ranks in
// turn, so any one may land on the smallest. When the pool is the
// smaller, context_exceeds_pool (warning) names both numbers. The maximum
// model length is kept in the worker record, so the number survives a
// restart.
//
// # What gateways dial, and how much they may send
//
// A worker's address (Address) is the host:port of its agent's advertise
// URL, else of the URL the agent dials. A loopback one is warned about
// (not_routable, warning): a gateway on another node cannot reach it, one
// on the same node can, so the worker is not held.
//
// A worker's max_concurrency (MaxConcurrency) is how many requests a
// gateway should have open on it at once, for HAProxy's maxconn and
// LiteLLM's max_parallel_requests. R is what the engine runs at once, as
// its agent reports (max running sequences per data-parallel rank × ranks);
// w is the worker's weight (pinned or computed); then
//
//	max_concurrency = max(R, ⌈R · w⌉)   (R alone for a worker without a weight)
//
// and null while R is unknown, so that no gateway is capped by a guess.
// Never below R: a cap under what the engine runs leaves it idle while
// requests wait at the gateway (a flat cap of 24 held back a worker that
// ran 32; caps scaled down by weight lost 15 % of the fleet's capacity at
// 90 % load, while caps equal to R were safe). Growing with the weight:
// weights are relative to the model's median worker, which gets exactly
// R; a worker measured k times faster finishes requests k times as often,
// so k times as many may wait on it for about as long as on the median.
// The KV pools are not part of the rule: how many sequences a pool holds
// depends on their lengths, which heft does not know, and an engine runs
// no more than R whatever its pool holds.
//
// # Measurements
//
// The newest measurement of each capacity key, decode and prefill parts
// together, is cached with a bounded history. When an agent (re)connects, a worker whose newest measurement
// is valid and younger than CacheTTL is sent a CachedMeasurement and not
// probed, so a reconnect or a coordinator restart costs no burst; so is
// the agent after each valid result. The agent keeps them and offers them
// in its next hello: a coordinator that restarted on an empty state takes
// the offer for a worker it has no valid fresh measurement of, after the
// checks a fresh result gets and with its own time, and asks no burst
// (offer.go); one it refuses is logged with the reason. Otherwise
// it is sent a ProbeRequest: "registration" when it has no valid
// measurement (a bad reading is replaced by a fresh measurement, never kept
// because of a restart), "scheduled" when its valid one is too old. While
// connected, a worker is re-measured ("scheduled") RemeasureEvery after its
// measurement; the agent runs scheduled probes only on an idle engine and
// answers deferred_busy otherwise, and the fleet asks again BusyRetry
// later, twice as long after each deferral in a row up to 16 × BusyRetry,
// with probe_deferred on the worker until a valid measurement (busy.go).
// Meanwhile the worker keeps its last valid measurement and weight.
// Probes go only to workers the agent has listed on its current
// connection, never from facts remembered across a restart. A probe
// result is taken only as the answer to one of the last two requests the
// fleet sent that node for that worker, once, within ProbeTimeout of its
// sending (ResultsRefused counts the others); a status only for the
// worker's current request.
// A failed probe status is retried FailRetry later, a request without an
// answer is re-sent after ProbeTimeout, and an admin's on-demand probe is
// sent at once and runs even on a busy engine. Measurement times from an
// agent whose clock is off by more than an hour are re-stamped with the
// coordinator's clock, so a skewed clock cannot cause a probe loop.
//
// # Admin decisions
//
// Pins of either weight, holds and admits are admin decisions. Hold
// stores "hold", HoldBelowFloor "hold_below_floor" (a hold heft-sync's
// floor lets go even for a model's last worker; the API shows it as
// "hold" with below_floor). Admit stores "admit" when the worker's pools, or an
// implausible measurement, would hold it; otherwise it clears any
// decision, returning the worker to the automatic rules. Decisions and pins are written to the Store before
// memory changes: when the write fails the call returns the error and the
// fleet is as it was. The write waits for the disk outside the fleet's
// lock, so agents' reports and API reads go on meanwhile; admin actions
// are applied one at a time, in the order of their writes. Worker records are written when their facts change
// (and at least every few minutes while seen); a failed record write is
// logged and retried, since the agent resends those facts anyway.
//
// # Connections
//
// The server numbers each agent connection. Connect(node, conn, hello)
// makes conn the node's current connection; Disconnect(node, conn) is
// ignored unless conn is still current, so a late Disconnect of a replaced
// connection does not mark the node offline. Probe requests outstanding
// on a connection are forgotten when a new one starts.
//
// # Changes
//
// Every change to a worker's view takes a sequence number, and a worker
// that leaves leaves a tombstone (the last 4,096 are kept). Since(seq)
// returns the workers changed after seq and the IDs removed, or the whole
// fleet when seq is 0 or older than the oldest tombstone: the live event
// stream sends one node's heartbeat as that node's workers, not the fleet.
package fleet
