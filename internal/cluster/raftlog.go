package cluster

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
)

// raftLogger is an hclog.Logger over slog for raft and its transport: each
// line of theirs becomes one slog record at the matching level (Trace and
// Debug at slog's debug levels, Info, Warn and Error at theirs), with raft's
// key/value pairs as attributes and the logger's name in "component".
//
// Two kinds of line are changed on the way:
//   - "heartbeat timeout reached, starting election" with no leader known
//     before is how every node starts (a single voter always says it):
//     it is logged at Info, not Warn.
//   - a line repeated for the same peer (a follower that is down makes
//     the leader report it several times a second) is logged at most once
//     per repeatWindow; the next one carries the count left out.
type raftLogger struct {
	l     *slog.Logger
	name  string
	args  []any
	level *hclog.Level // shared by the loggers derived from one another
	rate  *repeatLimiter
}

// repeatWindow is how often a repeated raft line is logged.
const repeatWindow = 10 * time.Second

// hclogFor returns the hclog.Logger raft's component name logs through.
func hclogFor(l *slog.Logger, name string) hclog.Logger {
	lvl := hclog.Trace
	return &raftLogger{l: l, name: name, level: &lvl, rate: newRepeatLimiter(repeatWindow, time.Now)}
}

var _ hclog.Logger = (*raftLogger)(nil)

func slogLevel(l hclog.Level) slog.Level {
	switch l {
	case hclog.Trace:
		return slog.LevelDebug - 4
	case hclog.Debug:
		return slog.LevelDebug
	case hclog.Info, hclog.NoLevel, hclog.DefaultLevel:
		return slog.LevelInfo
	case hclog.Warn:
		return slog.LevelWarn
	default: // Error, Off
		return slog.LevelError
	}
}

func (r *raftLogger) Log(level hclog.Level, msg string, args ...any) {
	if level == hclog.Off || level < *r.level {
		return
	}
	sl := slogLevel(level)
	if level == hclog.Warn && msg == "heartbeat timeout reached, starting election" && argValue(args, "last-leader-id") == "" {
		sl = slog.LevelInfo
	}
	ctx := context.Background()
	if !r.l.Enabled(ctx, sl) {
		return
	}
	all := make([]any, 0, len(r.args)+len(args)+4)
	all = append(all, "component", r.name)
	all = append(all, r.args...)
	all = append(all, args...)
	if len(all)%2 == 1 {
		// hclog's convention for a value without a key.
		all = append(all[:len(all)-1], "EXTRA_VALUE_AT_END", all[len(all)-1])
	}
	for i := 0; i+1 < len(all); i += 2 {
		// A key of slog's own (raft says "time" for a duration) would read
		// as a second timestamp.
		// So would "node", which queen's logger already carries.
		switch all[i] {
		case slog.TimeKey, slog.LevelKey, slog.MessageKey, slog.SourceKey, "node":
			all[i] = "raft_" + all[i].(string)
		}
		switch v := all[i+1].(type) {
		case error:
			all[i+1] = v.Error()
		case hclog.Format:
			if len(v) > 0 {
				if f, ok := v[0].(string); ok {
					all[i+1] = fmt.Sprintf(f, v[1:]...)
				}
			}
		}
	}
	if argValue(all, "error") == "transport shutdown" {
		// This node's own Close, not a fault.
		sl = slog.LevelDebug
		if !r.l.Enabled(ctx, sl) {
			return
		}
	}
	if level >= hclog.Warn {
		ok, suppressed := r.rate.allow(r.name + "\x00" + msg + "\x00" + peerOf(all))
		if !ok {
			return
		}
		if suppressed > 0 {
			all = append(all, "repeats_suppressed", suppressed, "over", repeatWindow.String())
		}
	}
	r.l.Log(ctx, sl, msg, all...)
}

// argValue returns the value of key in hclog's key/value list as text.
func argValue(args []any, key string) string {
	for i := 0; i+1 < len(args); i += 2 {
		if k, ok := args[i].(string); ok && k == key {
			return fmt.Sprint(args[i+1])
		}
	}
	return ""
}

// peerOf names the other node a line is about, for the repeat limit.
func peerOf(args []any) string {
	for _, k := range []string{"peer", "server-id", "target", "from", "candidate", "address", "last-leader-id"} {
		if v := argValue(args, k); v != "" {
			return v
		}
	}
	return ""
}

func (r *raftLogger) Trace(msg string, args ...any) { r.Log(hclog.Trace, msg, args...) }
func (r *raftLogger) Debug(msg string, args ...any) { r.Log(hclog.Debug, msg, args...) }
func (r *raftLogger) Info(msg string, args ...any)  { r.Log(hclog.Info, msg, args...) }
func (r *raftLogger) Warn(msg string, args ...any)  { r.Log(hclog.Warn, msg, args...) }
func (r *raftLogger) Error(msg string, args ...any) { r.Log(hclog.Error, msg, args...) }

func (r *raftLogger) enabled(l hclog.Level) bool {
	return l >= *r.level && r.l.Enabled(context.Background(), slogLevel(l))
}

func (r *raftLogger) IsTrace() bool { return r.enabled(hclog.Trace) }
func (r *raftLogger) IsDebug() bool { return r.enabled(hclog.Debug) }
func (r *raftLogger) IsInfo() bool  { return r.enabled(hclog.Info) }
func (r *raftLogger) IsWarn() bool  { return r.enabled(hclog.Warn) }
func (r *raftLogger) IsError() bool { return r.enabled(hclog.Error) }

func (r *raftLogger) ImpliedArgs() []any { return append([]any(nil), r.args...) }

func (r *raftLogger) With(args ...any) hclog.Logger {
	c := *r
	c.args = append(append([]any(nil), r.args...), args...)
	return &c
}

func (r *raftLogger) Name() string { return r.name }

func (r *raftLogger) Named(name string) hclog.Logger {
	c := *r
	if c.name != "" {
		c.name += "." + name
	} else {
		c.name = name
	}
	return &c
}

func (r *raftLogger) ResetNamed(name string) hclog.Logger {
	c := *r
	c.name = name
	return &c
}

func (r *raftLogger) SetLevel(l hclog.Level) { *r.level = l }
func (r *raftLogger) GetLevel() hclog.Level  { return *r.level }

func (r *raftLogger) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(r.StandardWriter(opts), "", 0)
}

// StandardWriter takes lines of the standard log package; a "[LEVEL]"
// prefix, as raft's older code writes, sets the level (Info otherwise).
func (r *raftLogger) StandardWriter(*hclog.StandardLoggerOptions) io.Writer {
	return stdWriter{r}
}

type stdWriter struct{ r *raftLogger }

func (w stdWriter) Write(p []byte) (int, error) {
	for _, line := range bytes.Split(bytes.TrimRight(p, "\n"), []byte("\n")) {
		s := strings.TrimSpace(string(line))
		if s == "" {
			continue
		}
		level := hclog.Info
		for _, c := range []struct {
			tag string
			l   hclog.Level
		}{{"[TRACE]", hclog.Trace}, {"[DEBUG]", hclog.Debug}, {"[INFO]", hclog.Info}, {"[WARN]", hclog.Warn}, {"[ERR]", hclog.Error}, {"[ERROR]", hclog.Error}} {
			if rest, ok := strings.CutPrefix(s, c.tag); ok {
				level, s = c.l, strings.TrimSpace(rest)
				break
			}
		}
		w.r.Log(level, s)
	}
	return len(p), nil
}

// repeatLimiter lets a key through at most once per window and counts what
// it held back.
type repeatLimiter struct {
	window time.Duration
	now    func() time.Time
	mu     sync.Mutex
	seen   map[string]*repeatState
}

type repeatState struct {
	last       time.Time // when it was last let through
	suppressed int
}

func newRepeatLimiter(window time.Duration, now func() time.Time) *repeatLimiter {
	return &repeatLimiter{window: window, now: now, seen: map[string]*repeatState{}}
}

// allow reports whether key may be logged now and, if so, how many times it
// was held back since it last was.
func (l *repeatLimiter) allow(key string) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	st := l.seen[key]
	if st == nil {
		if len(l.seen) >= 1024 {
			for k, s := range l.seen {
				if now.Sub(s.last) >= l.window && s.suppressed == 0 {
					delete(l.seen, k)
				}
			}
		}
		l.seen[key] = &repeatState{last: now}
		return true, 0
	}
	if now.Sub(st.last) < l.window {
		st.suppressed++
		return false, 0
	}
	n := st.suppressed
	st.last, st.suppressed = now, 0
	return true, n
}
