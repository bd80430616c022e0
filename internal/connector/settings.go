package connector

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Settings are one node's connector settings (the QUEEN_PG_* variables).
type Settings struct {
	Enabled              bool          // QUEEN_PG_CONNECTORS
	Threads              int           // QUEEN_PG_THREADS
	Reload               time.Duration // QUEEN_PG_RELOAD_MS
	LeaseTTL             time.Duration // QUEEN_PG_LEASE_TTL_MS
	ShutdownGrace        time.Duration // QUEEN_PG_SHUTDOWN_GRACE_MS
	AllowPrivateNetworks bool          // QUEEN_PG_ALLOW_PRIVATE_NETWORKS
}

// DefaultSettings are the settings of a node that sets none.
func DefaultSettings() Settings {
	return Settings{Enabled: true, Threads: 2, Reload: 5 * time.Second, LeaseTTL: 10 * time.Second,
		ShutdownGrace: 10 * time.Second, AllowPrivateNetworks: true}
}

// ParseSettings reads the QUEEN_PG_* settings through get (os.Getenv, or
// a flag's value); an empty value means the default. A value out of its
// range is an error naming the setting: the node refuses to start rather
// than adjust it.
func ParseSettings(get func(name string) string) (Settings, error) {
	s := DefaultSettings()
	var err error
	if s.Enabled, err = boolSetting(get, "QUEEN_PG_CONNECTORS", s.Enabled); err != nil {
		return s, err
	}
	if s.AllowPrivateNetworks, err = boolSetting(get, "QUEEN_PG_ALLOW_PRIVATE_NETWORKS", s.AllowPrivateNetworks); err != nil {
		return s, err
	}
	n, err := intSetting(get, "QUEEN_PG_THREADS", 2, 1, 16)
	if err != nil {
		return s, err
	}
	s.Threads = int(n)
	for _, d := range []struct {
		name        string
		dst         *time.Duration
		def, lo, hi int64
	}{
		{"QUEEN_PG_RELOAD_MS", &s.Reload, 5000, 500, 60000},
		{"QUEEN_PG_LEASE_TTL_MS", &s.LeaseTTL, 10000, 3000, 120000},
		{"QUEEN_PG_SHUTDOWN_GRACE_MS", &s.ShutdownGrace, 10000, 0, 120000},
	} {
		ms, err := intSetting(get, d.name, d.def, d.lo, d.hi)
		if err != nil {
			return s, err
		}
		*d.dst = time.Duration(ms) * time.Millisecond
	}
	return s, nil
}

func boolSetting(get func(string) string, name string, def bool) (bool, error) {
	switch v := strings.ToLower(strings.TrimSpace(get(name))); v {
	case "":
		return def, nil
	case "true", "1", "yes", "on":
		return true, nil
	case "false", "0", "no", "off":
		return false, nil
	default:
		return false, fmt.Errorf("%s=%q: want true or false", name, v)
	}
}

func intSetting(get func(string) string, name string, def, lo, hi int64) (int64, error) {
	v := strings.TrimSpace(get(name))
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s=%q: want a whole number from %d to %d", name, v, lo, hi)
	}
	if n < lo || n > hi {
		return 0, fmt.Errorf("%s=%d is out of range: want %d to %d", name, n, lo, hi)
	}
	return n, nil
}
