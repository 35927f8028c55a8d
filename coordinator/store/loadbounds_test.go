package store

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// A measurement stored before the wire bounded a load (kv_usage 85, a
// stale_seconds past ten years) loads without that load: its throughput
// is not lost to a bound on what only explained it. One whose own numbers
// are bad is still dropped.
func TestStoredLoadPastTheBoundsKeepsTheMeasurement(t *testing.T) {
	dir := t.TempDir()
	b := open(t, dir)
	at := time.Now()
	for key, load := range map[string]string{
		"kv":    `{"known":true,"running":3,"waiting":0,"kv_usage":85}`,
		"stale": `{"known":true,"running":3,"waiting":0,"kv_usage":0.5,"stale_seconds":1e300}`,
	} {
		m := measurement(key, 900, at)
		v, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		v = bytes.Replace(v, []byte(`"load_before":{"known":false,"running":0,"waiting":0,"kv_usage":0}`), []byte(`"load_before":`+load), 1)
		if !bytes.Contains(v, []byte(load)) {
			t.Fatalf("no load_before to replace in %s", v)
		}
		if err := b.db.Update(func(tx *bolt.Tx) error {
			return tx.Bucket(bucketLatest).Put([]byte(key), seal(bucketLatest, []byte(key), v))
		}); err != nil {
			t.Fatal(err)
		}
	}
	bad := measurement("bad", 900, at)
	bad.ThroughputTPS = -1
	v, _ := json.Marshal(bad)
	v = bytes.Replace(v, []byte(`"kv_usage":0}`), []byte(`"kv_usage":85}`), 1)
	if err := b.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketLatest).Put([]byte("bad"), seal(bucketLatest, []byte("bad"), v))
	}); err != nil {
		t.Fatal(err)
	}
	st, err := b.Load()
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	for _, key := range []string{"kv", "stale"} {
		m, ok := st.Latest[key]
		if !ok || m.ThroughputTPS != 900 || m.LoadBefore.Known {
			t.Errorf("%s: loaded %v, throughput %v, load before %+v; want 900 without the load", key, ok, m.ThroughputTPS, m.LoadBefore)
		}
	}
	if _, ok := st.Latest["bad"]; ok {
		t.Error("a measurement with a negative throughput was loaded")
	}
}
