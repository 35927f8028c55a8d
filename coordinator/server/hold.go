package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"heft/shared/view"
)

// A hold takes a worker out of the weight table; heft-sync's floor still
// keeps a model's last workers in the gateways (min_serving) unless the
// admin says the hold may go below it: POST .../hold?below_floor=true, or
// the body {"below_floor": true}. The flag is part of the stored decision
// and every hold states it anew: a hold without it replaces one with it.

// holdBody is the optional body of POST .../hold.
type holdBody struct {
	BelowFloor *bool `json:"below_floor"`
}

// decodeHold reads below_floor from the query and the body (either may be
// absent, both must agree). A non-zero status is the error.
func decodeHold(s *Server, r *http.Request) (adminArg, int, string) {
	var fromQuery *bool
	if q := r.URL.Query(); q.Has("below_floor") {
		v, err := strconv.ParseBool(q.Get("below_floor"))
		if err != nil {
			return adminArg{}, http.StatusBadRequest, fmt.Sprintf("below_floor=%q is not true or false", q.Get("below_floor"))
		}
		fromQuery = &v
	}
	data, err := io.ReadAll(r.Body)
	if err != nil {
		status, msg := bodyError(err)
		return adminArg{}, status, msg
	}
	var fromBody *bool
	if len(bytes.TrimSpace(data)) > 0 {
		const want = `the body of a hold is empty or {"below_floor": true|false}`
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		var b holdBody
		if err := dec.Decode(&b); err != nil {
			return adminArg{}, http.StatusBadRequest, fmt.Sprintf("%s: %v", want, err)
		}
		if err := dec.Decode(new(json.RawMessage)); err != io.EOF {
			return adminArg{}, http.StatusBadRequest, want + ": trailing data after the object"
		}
		fromBody = b.BelowFloor
	}
	if fromQuery != nil && fromBody != nil && *fromQuery != *fromBody {
		return adminArg{}, http.StatusBadRequest, fmt.Sprintf("below_floor %t in the query and %t in the body disagree", *fromQuery, *fromBody)
	}
	below := (fromQuery != nil && *fromQuery) || (fromBody != nil && *fromBody)
	return adminArg{belowFloor: below}, 0, ""
}

// hold runs a hold, below the floor when the admin said so.
func (s *Server) hold(wk view.Worker, a adminArg) error {
	if a.belowFloor {
		return s.fleet.HoldBelowFloor(wk.ID)
	}
	return s.fleet.Hold(wk.ID)
}
