package nginx

import "time"

// SetClock replaces the clock the refusal memories read.
func (n *Nginx) SetClock(now func() time.Time) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.now = now
}
