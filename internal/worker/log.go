package worker

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"golang.org/x/term"
)

// logLevels are the values of LOG_LEVEL.
var logLevels = map[string]slog.Level{
	"debug": slog.LevelDebug,
	"info":  slog.LevelInfo,
	"warn":  slog.LevelWarn,
	"error": slog.LevelError,
}

// secretKeys are attribute keys whose values are never written, whoever
// logs them.
var secretKeys = map[string]bool{
	"password":       true,
	"token":          true,
	"admin_token":    true,
	"secret":         true,
	"retry_secret":   true,
	"redis_password": true,
	"sasl_password":  true,
	"authorization":  true,
}

// NewLogger returns a logger writing to w at level (a LOG_LEVEL value):
// JSON lines, or text when w is a terminal. Attribute keys are snake_case
// constants; values of secretKeys are replaced by "****".
func NewLogger(w io.Writer, level string) (*slog.Logger, error) {
	lvl, ok := logLevels[level]
	if !ok {
		return nil, fmt.Errorf("log level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{
		Level: lvl,
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if secretKeys[strings.ToLower(a.Key)] {
				return slog.String(a.Key, mask)
			}
			return a
		},
	}
	if IsTerminal(w) {
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return slog.New(slog.NewJSONHandler(w, opts)), nil
}

// IsTerminal reports whether w is a terminal.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// redisLogger adapts log for go-redis's internal messages (redis.SetLogger),
// which are about connection trouble: warn, with component=redis.
type redisLogger struct{ log *slog.Logger }

// Printf logs one go-redis message.
func (l redisLogger) Printf(ctx context.Context, format string, args ...any) {
	if !l.log.Enabled(ctx, slog.LevelWarn) {
		return
	}
	l.log.LogAttrs(ctx, slog.LevelWarn, OneLine(fmt.Sprintf(format, args...)), slog.String("component", "redis"))
}
