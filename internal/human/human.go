// Package human formats numbers for people: byte sizes in binary units
// (the units Postgres reports in), counts with thousands separators, and
// durations in their two largest units.
package human

import (
	"fmt"
	"strconv"
	"time"
)

// byteUnits are the binary units Bytes uses above B, smallest first.
var byteUnits = []string{"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}

// Bytes formats n bytes in binary units with two or three significant
// digits: 512 B, 1.5 KiB, 12 MiB, 1023 MiB, 1.0 GiB.
func Bytes(n int64) string {
	if n < 0 {
		return "-" + Bytes(-n) // -n of math.MinInt64 stays negative; not a size anyone has
	}
	if n < 1024 {
		return strconv.FormatInt(n, 10) + " B"
	}
	v := float64(n)
	for _, u := range byteUnits {
		v /= 1024
		// Step up a unit when rounding would print 1024 of this one.
		if v < 9.95 {
			return fmt.Sprintf("%.1f %s", v, u)
		}
		if v < 1023.5 || u == byteUnits[len(byteUnits)-1] {
			return fmt.Sprintf("%.0f %s", v, u)
		}
	}
	panic("unreachable")
}

// Count formats n with a comma between thousands: 1,234,567.
func Count(n int64) string {
	s := strconv.FormatInt(n, 10)
	sign := ""
	if n < 0 {
		sign, s = "-", s[1:]
	}
	out := make([]byte, 0, len(s)+len(s)/3)
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	return sign + string(out)
}

// Duration formats d to its two largest units, rounded down, without a
// zero second one: 4s, 3m12s, 12m, 3h12m, 2h, 2d3h. Below a second it is
// 0s.
func Duration(d time.Duration) string {
	if d < 0 {
		return "-" + Duration(-d)
	}
	d = d.Truncate(time.Second)
	days, hours := int64(d/(24*time.Hour)), int64(d/time.Hour)%24
	mins, secs := int64(d/time.Minute)%60, int64(d/time.Second)%60
	two := func(a int64, ua string, b int64, ub string) string {
		if b == 0 {
			return fmt.Sprintf("%d%s", a, ua)
		}
		return fmt.Sprintf("%d%s%d%s", a, ua, b, ub)
	}
	switch {
	case days > 0:
		return two(days, "d", hours, "h")
	case hours > 0:
		return two(hours, "h", mins, "m")
	case mins > 0:
		return two(mins, "m", secs, "s")
	}
	return fmt.Sprintf("%ds", secs)
}
