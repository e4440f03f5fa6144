package redisstore

import (
	"sync"
	"testing"
)

// TestNameCache: names found in the cache are the names built, whatever
// the collisions between kinds, generations and buckets, on one server
// and on a cluster, with goroutines naming keys at once.
func TestNameCache(t *testing.T) {
	for _, k := range []keys{newKeys(Config{Prefix: "fkmat:s:j"}), newClusterKeys(Config{Prefix: "fkmat:s:j"}, 3)} {
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Go(func() {
				for round := range 3 {
					for bucket := range uint64(nameSlots + 1000) {
						for _, kind := range []byte{kindLeft, kindRight, kindSubs} {
							gen := uint64(g + round)
							if got, want := k.name(kind, gen, bucket), k.build(kind, gen, bucket); got != want {
								t.Errorf("name(%c, %d, %d) = %q, want %q", kind, gen, bucket, got, want)
								return
							}
						}
					}
				}
			})
		}
		wg.Wait()
	}
}
