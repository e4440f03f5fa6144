package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
)

// redisLogger sends go-redis's internal messages (pool dial failures and
// the like, printed to stderr by default) to slog at debug level, so that
// --log-format json stays JSON and --log-level applies. The pipeline logs
// the errors that matter itself.
type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.log.DebugContext(ctx, strings.TrimSpace(fmt.Sprintf(format, v...)))
}
