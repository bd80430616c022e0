// Package auth owns authentication and the tenant/role model of the broker
// (docs/http-api.md, "Auth and tenants"): it loads the tokens file (QUEEN_TOKENS_FILE),
// verifies HS256/RS256 JWTs (QUEEN_JWT_SECRET, QUEEN_JWT_PUBLIC_KEY), and turns
// the bearer token of a request into an Identity: the tenant the request acts
// in and the role it holds (read, write or admin).
//
// It knows nothing about routes or HTTP handlers: which role a route needs is
// decided by internal/httpapi (authz.go), which also stores the Identity in the
// request context. Tokens are never logged or echoed in errors; only their
// sha256 hashes are kept in memory.
package auth
