package join

// SetReorder makes e permute each segment's response queue with f before
// resolving it, simulating out-of-order (pipelined) stages.
func SetReorder(e *Engine, f func([]Response)) { e.reorder = f }

// ForgetRows drops the memory of m's joined rows, which tests comparing
// mutations do not describe.
func ForgetRows(m *Mutations) { m.rows = nil }
