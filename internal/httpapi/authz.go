package httpapi

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/queen-mq/queen/internal/auth"
	"github.com/queen-mq/queen/internal/broker"
)

// This file is the HTTP side of auth (docs/http-api.md, "Auth and tenants"): it
// authenticates each request with Config.Auth, decides the role the route
// needs, answers 401/403, and stores the identity in the request context,
// where tenant(r) reads it. Without Config.Auth (or with nothing configured
// in it) every request is tenant "default" with admin rights.

// Authenticator is the type of Config.Auth (an alias, so server.go needs no
// import of internal/auth). Nil, or one with nothing configured, means open.
type Authenticator = auth.Authenticator

// openRoutes answer without a token even when auth is on (GET and HEAD only).
var openRoutes = map[string]bool{
	"/health":             true,
	"/metrics/prometheus": true,
}

// routeRoles lists the routes that need more than the method rule gives:
// GET and HEAD need read, every other method needs write, and these need
// admin. Patterns use ServeMux syntax; a {wildcard} matches one path
// segment, {name...} the rest of the path. A route missing here (including
// routes added later) falls to the method rule, so new destructive or
// cluster-wide routes must be added here.
var routeRoles = []struct {
	method, pattern string
	role            auth.Role
}{
	// Popping is a GET but consumes: it takes leases, auto-acknowledges,
	// and creates the queue and the group.
	{"GET", "/api/v1/pop/queue/{queue}", auth.RoleWrite},
	{"GET", "/api/v1/pop/queue/{queue}/partition/{partition}", auth.RoleWrite},
	// Destroying a queue or a consumer group's state.
	{"DELETE", "/api/v1/resources/queues/{queue}", auth.RoleAdmin},
	{"DELETE", "/api/v1/consumer-groups/{group}", auth.RoleAdmin},
	{"DELETE", "/api/v1/consumer-groups/{group}/queues/{queue}", auth.RoleAdmin},
	// Connectors (docs/http-api.md, "Connectors": writes need an admin token).
	{"PUT", "/api/v1/connectors/{name}", auth.RoleAdmin},
	{"DELETE", "/api/v1/connectors/{name}", auth.RoleAdmin},
	{"POST", "/api/v1/connectors/{name}/resync", auth.RoleAdmin},
	// Cluster membership: the operator's, never a tenant's.
	{"POST", "/api/v1/cluster/join", auth.RoleOperator},
	{"DELETE", "/api/v1/cluster/members/{id}", auth.RoleOperator},
}

// operatorReads are the routes an operator may read besides those that
// need the operator role. An operator acts in no tenant, so every tenant
// route refuses it.
var operatorReads = map[string]bool{
	"GET /api/v1/cluster": true,
}

// routeRoleIndex maps "METHOD /path/{}/..." (wildcard names erased) to a role.
var routeRoleIndex = func() map[string]auth.Role {
	m := make(map[string]auth.Role, len(routeRoles))
	for _, rr := range routeRoles {
		m[rr.method+" "+erasePattern(rr.pattern)] = rr.role
	}
	return m
}()

// methodRole is the rule for every route not in routeRoles.
func methodRole(method string) auth.Role {
	if method == http.MethodGet || method == http.MethodHead {
		return auth.RoleRead
	}
	return auth.RoleWrite
}

// requiredRole is the role a request needs. It matches the request path
// against routeRoles the way ServeMux does (per escaped segment, each one
// unescaped), and also looks up the pattern ServeMux itself picks for the
// request, so no spelling of a path can reach an admin handler with a
// weaker role. The strictest answer wins.
func (s *Server) requiredRole(r *http.Request) auth.Role {
	need := methodRole(r.Method)
	segs := strings.Split(r.URL.EscapedPath(), "/")
	for i, sg := range segs {
		if u, err := url.PathUnescape(sg); err == nil {
			segs[i] = u
		}
	}
	for _, rr := range routeRoles {
		if rr.method == r.Method && rr.role > need && matchSegments(strings.Split(rr.pattern, "/"), segs) {
			need = rr.role
		}
	}
	if s != nil && s.mux != nil {
		if _, pat := s.mux.Handler(r); pat != "" {
			method, path := splitPattern(pat)
			if method == "" {
				method = r.Method
			}
			if role, ok := routeRoleIndex[method+" "+erasePattern(path)]; ok && role > need {
				need = role
			}
		}
	}
	return need
}

// matchSegments matches unescaped path segments against pattern segments.
func matchSegments(pat, segs []string) bool {
	for i, p := range pat {
		if strings.HasPrefix(p, "{") && strings.HasSuffix(p, "...}") {
			return true
		}
		if i >= len(segs) {
			return false
		}
		if strings.HasPrefix(p, "{") && strings.HasSuffix(p, "}") {
			if segs[i] == "" {
				return false
			}
			continue
		}
		if p != segs[i] {
			return false
		}
	}
	return len(pat) == len(segs)
}

// erasePattern replaces every {wildcard} of a pattern by {} so that
// patterns differing only in wildcard names compare equal.
func erasePattern(p string) string {
	segs := strings.Split(p, "/")
	for i, sg := range segs {
		if strings.HasPrefix(sg, "{") && strings.HasSuffix(sg, "}") {
			if strings.HasSuffix(sg, "...}") {
				segs[i] = "{...}"
			} else {
				segs[i] = "{}"
			}
		}
	}
	return strings.Join(segs, "/")
}

// splitPattern splits a ServeMux pattern "[METHOD ][HOST]/PATH".
func splitPattern(pat string) (method, path string) {
	if m, rest, ok := strings.Cut(pat, " "); ok {
		method, pat = m, strings.TrimSpace(rest)
	}
	if i := strings.IndexByte(pat, '/'); i >= 0 {
		return method, pat[i:]
	}
	return method, pat
}

type identityKey struct{}

// withIdentity returns r carrying id for tenant(r) and handlers.
func withIdentity(r *http.Request, id auth.Identity) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), identityKey{}, id))
}

// identityOf is the identity the middleware stored; auth.Open when none
// was stored (auth off, or a handler called outside ServeHTTP).
func identityOf(r *http.Request) auth.Identity {
	if id, ok := r.Context().Value(identityKey{}).(auth.Identity); ok {
		return id
	}
	return auth.Open
}

// tenantOf is the tenant a request acts in.
func tenantOf(r *http.Request) string { return identityOf(r).Tenant }

// authorize authenticates r and checks its role. It returns the request to
// serve (carrying the identity), or false after writing a 401 or 403.
func (s *Server) authorize(w http.ResponseWriter, r *http.Request) (*http.Request, bool) {
	a := s.cfg.Auth
	if !a.Enabled() {
		// identityOf answers auth.Open for a request without one: no
		// copy of the request is needed.
		return r, true
	}
	if (r.Method == http.MethodGet || r.Method == http.MethodHead) && openRoutes[r.URL.Path] {
		return r, true
	}
	id, err := a.Authenticate(r.Header.Get("Authorization"))
	if err != nil {
		s.log.Debug("unauthorized request", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr, "reason", err.Error())
		w.Header().Set("WWW-Authenticate", `Bearer realm="queen", error="invalid_token"`)
		writeError(w, &broker.Error{Code: "unauthorized", Message: err.Error()})
		return nil, false
	}
	need := s.requiredRole(r)
	if !id.Role.Allows(need) && !(id.IsOperator() && s.operatorMayRead(r)) {
		s.log.Debug("forbidden request", "method", r.Method, "path", r.URL.Path, "tenant", id.Tenant, "role", id.Role.String(), "need", need.String())
		msg := fmt.Sprintf("%s %s needs the %s role; this token has %s in tenant %q; use a token with %s rights", r.Method, r.URL.Path, need, id.Role, id.Tenant, need)
		switch {
		case need == auth.RoleOperator:
			msg = fmt.Sprintf("%s %s changes the cluster, which needs an operator token (tokens file: `<sha256> * operator`; JWT: \"role\": \"operator\" and no tenant); this token has %s in tenant %q, and no tenant's role may change the cluster", r.Method, r.URL.Path, id.Role, id.Tenant)
		case id.IsOperator():
			msg = fmt.Sprintf("%s %s is a tenant's route; an operator token acts in no tenant and may use only GET /api/v1/cluster, POST /api/v1/cluster/join and DELETE /api/v1/cluster/members/{id}; use a token of the tenant", r.Method, r.URL.Path)
		}
		forbidden(w, msg)
		return nil, false
	}
	return withIdentity(r, id), true
}

// forbidden answers 403 with msg.
func forbidden(w http.ResponseWriter, msg string) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="queen", error="insufficient_scope"`)
	writeError(w, &broker.Error{Code: "forbidden", Message: msg})
}

// operatorMayRead reports whether r is one of operatorReads, as ServeMux
// routes it.
func (s *Server) operatorMayRead(r *http.Request) bool {
	if s.mux == nil || r.Method != http.MethodGet && r.Method != http.MethodHead {
		return false
	}
	_, pat := s.mux.Handler(r)
	return operatorReads[pat]
}

// needOperator refuses a request that asks for what only the operator may
// see (when auth is on); it reports whether r may go on.
func (s *Server) needOperator(w http.ResponseWriter, r *http.Request, what string) bool {
	if !s.cfg.Auth.Enabled() || identityOf(r).IsOperator() {
		return true
	}
	id := identityOf(r)
	forbidden(w, fmt.Sprintf("%s needs an operator token (tokens file: `<sha256> * operator`; JWT: \"role\": \"operator\" and no tenant); this token has %s in tenant %q", what, id.Role, id.Tenant))
	return false
}
