package jointest

import "github.com/fkmat/fkmat/join"

// Values returns s as join values: "NULL" is NULL, "TOAST" an unchanged
// TOASTed value, anything else text.
func Values(s ...string) []join.Value {
	out := make([]join.Value, len(s))
	for i, x := range s {
		switch x {
		case "NULL":
			out[i] = join.NullValue()
		case "TOAST":
			out[i] = join.ToastValue()
		default:
			out[i] = join.TextValue(x)
		}
	}
	return out
}
