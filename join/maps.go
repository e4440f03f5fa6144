package join

import "sync"

// The maps of state a StateReader returns are new and the caller's; the
// engine gives back the ones it has read (releaseLeftMap, releaseRightMap)
// and readers that make them take them from here (NewLeftMap,
// NewRightMap): a batch's reads then reuse the last batches' maps.
var leftMaps, rightMaps sync.Pool

// NewLeftMap returns an empty map for about n left states.
func NewLeftMap(n int) map[Key]LeftState {
	if m, ok := leftMaps.Get().(map[Key]LeftState); ok {
		return m
	}
	return make(map[Key]LeftState, n)
}

// NewRightMap returns an empty map for about n right states.
func NewRightMap(n int) map[Key]RightState {
	if m, ok := rightMaps.Get().(map[Key]RightState); ok {
		return m
	}
	return make(map[Key]RightState, n)
}

// releaseLeftMap gives back a map read: nothing may use it after.
func releaseLeftMap(m map[Key]LeftState) {
	if m == nil || len(m) > keptEntries {
		return
	}
	clear(m)
	leftMaps.Put(m)
}

// releaseRightMap gives back a map read: nothing may use it after.
func releaseRightMap(m map[Key]RightState) {
	if m == nil || len(m) > keptEntries {
		return
	}
	clear(m)
	rightMaps.Put(m)
}
