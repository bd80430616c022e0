package httpapi

import (
	"crypto/subtle"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"

	"github.com/queen-mq/queen/internal/auth"
	"github.com/queen-mq/queen/internal/broker"
)

// newRegistry builds the registry /metrics/prometheus serves: the broker's
// metrics, HTTP latencies, and the Go runtime's.
func (s *Server) newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	s.httpLat = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "queen_http_request_seconds",
		Help:    "HTTP request latency by tenant, route and status (long polls included).",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2, 20),
	}, []string{"tenant", "route", "code"})
	reg.MustRegister(s.httpLat, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if err := s.b.Register(reg); err != nil {
		s.log.Error("registering broker metrics failed", "err", err)
	}
	if s.cfg.Connectors != nil {
		if err := s.cfg.Connectors.Register(reg); err != nil {
			s.log.Error("registering connector metrics failed", "err", err)
		}
	}
	return reg
}

// metricsHandler serves the registry to each scraper as much as it may
// see. With auth off everything is shown. With auth on, series that name a
// tenant (and so its queues and groups) are shown only to the operator's
// QUEEN_METRICS_TOKEN (every tenant) or to a token of that tenant (any
// role); without a token only series that name no tenant are shown. An
// unknown token is 401, so a wrong scrape config is not mistaken for an
// idle broker.
func (s *Server) metricsHandler() http.Handler {
	all := promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a := s.cfg.Auth
		if !a.Enabled() {
			all.ServeHTTP(w, r)
			return
		}
		h := r.Header.Get("Authorization")
		if strings.TrimSpace(h) == "" {
			promhttp.HandlerFor(s.gatherTenant(""), promhttp.HandlerOpts{}).ServeHTTP(w, r)
			return
		}
		if s.cfg.MetricsToken != "" {
			if tok, err := auth.ParseBearer(h); err == nil && subtle.ConstantTimeCompare([]byte(auth.HashToken(tok)), []byte(auth.HashToken(s.cfg.MetricsToken))) == 1 {
				all.ServeHTTP(w, r)
				return
			}
		}
		id, err := a.Authenticate(h)
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="queen", error="invalid_token"`)
			writeError(w, &broker.Error{Code: "unauthorized",
				Message: err.Error() + "; scrape with QUEEN_METRICS_TOKEN or an operator token (every tenant), a token of one tenant (that tenant), or no token (series without tenant names)"})
			return
		}
		if id.IsOperator() {
			// The operator runs the cluster for every tenant.
			all.ServeHTTP(w, r)
			return
		}
		promhttp.HandlerFor(s.gatherTenant(id.Tenant), promhttp.HandlerOpts{}).ServeHTTP(w, r)
	})
}

// gatherTenant gathers the registry keeping the series without a tenant
// label and those of tenant ("" keeps only the former).
func (s *Server) gatherTenant(tenant string) prometheus.Gatherer {
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		fams, err := s.reg.Gather()
		out := fams[:0]
		for _, f := range fams {
			kept := f.Metric[:0]
			for _, m := range f.Metric {
				if t, ok := tenantLabel(m); !ok || (tenant != "" && t == tenant) {
					kept = append(kept, m)
				}
			}
			if len(kept) > 0 {
				f.Metric = kept
				out = append(out, f)
			}
		}
		return out, err
	})
}

func tenantLabel(m *dto.Metric) (string, bool) {
	for _, l := range m.Label {
		if l.GetName() == "tenant" {
			return l.GetValue(), true
		}
	}
	return "", false
}

// latencyKey names one series of a route's latency histogram.
type latencyKey struct {
	tenant string
	code   int
}

// routeLatency keeps the observers of one route's series, so a request
// does not format its status and look its labels up in the vector.
type routeLatency struct {
	vec   *prometheus.HistogramVec
	route string
	mu    sync.RWMutex
	obs   map[latencyKey]prometheus.Observer
}

func (l *routeLatency) observe(tenant string, code int, d time.Duration) {
	k := latencyKey{tenant, code}
	l.mu.RLock()
	o := l.obs[k]
	l.mu.RUnlock()
	if o == nil {
		o = l.vec.WithLabelValues(tenant, l.route, strconv.Itoa(code))
		l.mu.Lock()
		l.obs[k] = o
		l.mu.Unlock()
	}
	o.Observe(d.Seconds())
}

// timed records a handler's latency under its route pattern.
func (s *Server) timed(route string, h http.HandlerFunc) http.HandlerFunc {
	lat := &routeLatency{vec: s.httpLat, route: route, obs: map[latencyKey]prometheus.Observer{}}
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec, ok := w.(*replyWriter) // ServeHTTP's
		if !ok {
			rec = &replyWriter{ResponseWriter: w}
		}
		code := func() int {
			if rec.code == 0 {
				return http.StatusOK // nothing written: net/http answers 200
			}
			return rec.code
		}
		if r.Method == http.MethodGet && strings.Contains(r.URL.RawQuery, "consistency") {
			// consistency=stale: an explicit opt-in to read this node's
			// own state without the leader (status pages).
			switch c := queryGet(r, "consistency"); c {
			case "", "null", "linearizable":
			case "stale":
				r = r.WithContext(broker.AllowStale(r.Context()))
			default:
				writeError(rec, &broker.Error{Code: "invalid_parameter", Field: "consistency", Message: fmt.Sprintf("consistency must be linearizable (the default) or stale, got %q", c)})
				lat.observe(s.tenant(r), code(), time.Since(start))
				return
			}
		}
		h(rec, r)
		lat.observe(s.tenant(r), code(), time.Since(start))
	}
}
