package fkmat

import (
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

func TestNewRedisClientURLs(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		url     string
		cluster bool
		addrs   []string
		user    string
		tls     bool
		err     string
	}{
		{url: "redis://localhost:6379/0"},
		{url: "redis+cluster://10.0.0.1:7000", cluster: true, addrs: []string{"10.0.0.1:7000"}},
		{url: "redis+cluster://fkmat:secret@10.0.0.1:7000,10.0.0.2:7001/", cluster: true,
			addrs: []string{"10.0.0.1:7000", "10.0.0.2:7001"}, user: "fkmat"},
		{url: "rediss+cluster://u:p@a.example:7000,b.example:7000?dial_timeout=3", cluster: true,
			addrs: []string{"a.example:7000", "b.example:7000"}, user: "u", tls: true},
		{url: "redis+cluster://h:7000/0", cluster: true, addrs: []string{"h:7000"}},
		{url: "redis+cluster://h:7000/3", err: "only database 0"},
		{url: "redis+cluster://h:7000,", err: "host:port"},
		{url: "redis+cluster://h", err: "host:port"},
		{url: "http+cluster://h:1", err: "scheme"},
	} {
		rdb, err := newRedisClient(tt.url)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%s: error %v, want one with %q", tt.url, err, tt.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tt.url, err)
			continue
		}
		cc, ok := rdb.(*redis.ClusterClient)
		if ok != tt.cluster {
			t.Errorf("%s: client %T", tt.url, rdb)
		}
		if ok {
			o := cc.Options()
			if strings.Join(o.Addrs, ",") != strings.Join(tt.addrs, ",") || o.Username != tt.user || (o.TLSConfig != nil) != tt.tls {
				t.Errorf("%s: addrs %v user %q tls %v", tt.url, o.Addrs, o.Username, o.TLSConfig != nil)
			}
			if o.TLSConfig != nil && o.TLSConfig.ServerName != "" {
				t.Errorf("%s: TLS server name %q fixed for every node", tt.url, o.TLSConfig.ServerName)
			}
		}
		_ = rdb.Close()
	}
}
