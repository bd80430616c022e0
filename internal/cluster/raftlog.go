package cluster

import (
	"context"
	"fmt"
	"log/slog"
)

// raftLogger is etcd raft's Logger over slog, in component "raft". raft's
// Info lines (every election step of every node) are logged at debug;
// its warnings and errors at theirs. Fatal and Panic log, then panic, as
// raft expects of them.
type raftLogger struct{ l *slog.Logger }

func newRaftLogger(l *slog.Logger) *raftLogger { return &raftLogger{l: l.With("component", "raft")} }

func (r *raftLogger) log(level slog.Level, msg string) {
	if r.l.Enabled(context.Background(), level) {
		r.l.Log(context.Background(), level, msg)
	}
}

func (r *raftLogger) Debug(v ...any) { r.log(slog.LevelDebug-4, fmt.Sprint(v...)) }
func (r *raftLogger) Debugf(format string, v ...any) {
	r.log(slog.LevelDebug-4, fmt.Sprintf(format, v...))
}
func (r *raftLogger) Info(v ...any) { r.log(slog.LevelDebug, fmt.Sprint(v...)) }
func (r *raftLogger) Infof(format string, v ...any) {
	r.log(slog.LevelDebug, fmt.Sprintf(format, v...))
}
func (r *raftLogger) Warning(v ...any) { r.log(slog.LevelWarn, fmt.Sprint(v...)) }
func (r *raftLogger) Warningf(format string, v ...any) {
	r.log(slog.LevelWarn, fmt.Sprintf(format, v...))
}
func (r *raftLogger) Error(v ...any) { r.log(slog.LevelError, fmt.Sprint(v...)) }
func (r *raftLogger) Errorf(format string, v ...any) {
	r.log(slog.LevelError, fmt.Sprintf(format, v...))
}
func (r *raftLogger) Fatal(v ...any)                 { r.Panic(v...) }
func (r *raftLogger) Fatalf(format string, v ...any) { r.Panicf(format, v...) }
func (r *raftLogger) Panic(v ...any) {
	s := fmt.Sprint(v...)
	r.log(slog.LevelError, s)
	panic(s)
}
func (r *raftLogger) Panicf(format string, v ...any) {
	s := fmt.Sprintf(format, v...)
	r.log(slog.LevelError, s)
	panic(s)
}
