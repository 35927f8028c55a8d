package syncer

import (
	"errors"
	"fmt"
)

// Validate returns every problem with the floor's settings, named by
// heft-sync's configuration keys.
func (f Floor) Validate() error {
	var errs []error
	if f.MinServing < 0 {
		errs = append(errs, fmt.Errorf("min_serving %d is below 0", f.MinServing))
	}
	if f.MinCapacity < 0 || f.MinCapacity > 1 || f.MinCapacity != f.MinCapacity {
		errs = append(errs, fmt.Errorf("min_serving_capacity %g is not a share between 0 and 1", f.MinCapacity))
	}
	if f.KeepUnlisted < 0 {
		errs = append(errs, fmt.Errorf("keep_unlisted %s is below 0", f.KeepUnlisted))
	}
	return errors.Join(errs...)
}
