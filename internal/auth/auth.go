package auth

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"
)

// DefaultTenant is the tenant of every request when auth is off.
const DefaultTenant = "default"

// MaxTokenLen bounds a bearer token; longer ones are refused unread.
const MaxTokenLen = 16 << 10

// MinSecretLen is the HS256 secret length below which Warnings complains
// (RFC 7518 asks for a key at least as long as the hash: 32 bytes).
const MinSecretLen = 32

// Identity is who a request acts as.
type Identity struct {
	// Tenant is the tenant it acts in; OperatorTenant for an operator.
	Tenant string
	Role   Role
	// Via says how it was established: "token", "jwt" or "open".
	Via string
}

// IsOperator reports whether id is the cluster's operator (no tenant).
func (id Identity) IsOperator() bool { return id.Role == RoleOperator }

// Open is the identity of every request when no auth is configured.
var Open = Identity{Tenant: DefaultTenant, Role: RoleAdmin, Via: "open"}

// Config says where identities come from. An empty Config means no auth:
// the server is open.
type Config struct {
	// TokensFile is the path of a tokens file (QUEEN_TOKENS_FILE).
	TokensFile string
	// Tokens are added to those of TokensFile (for embedding and tests).
	Tokens []TokenEntry
	// JWTSecret enables HS256 JWTs (QUEEN_JWT_SECRET).
	JWTSecret string
	// JWTPublicKey enables RS256 JWTs: PEM text or a path (QUEEN_JWT_PUBLIC_KEY).
	JWTPublicKey string
	// Leeway on exp/nbf; 0 means DefaultLeeway.
	Leeway time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Authenticator turns bearer tokens into identities. It is safe for
// concurrent use; nothing in it changes after New.
type Authenticator struct {
	tokens   map[string]Identity // sha256 hex -> identity
	jwt      jwtVerifier
	enabled  bool
	file     string
	warnings []string
}

// New builds an Authenticator. With nothing configured it returns an
// Authenticator whose Enabled is false (open mode). Errors are start-up
// errors that name what to fix.
func New(cfg Config) (*Authenticator, error) {
	a := &Authenticator{tokens: map[string]Identity{}, file: cfg.TokensFile}
	a.jwt.leeway = cfg.Leeway
	if a.jwt.leeway <= 0 {
		a.jwt.leeway = DefaultLeeway
	}
	a.jwt.now = cfg.Now
	if a.jwt.now == nil {
		a.jwt.now = time.Now
	}
	entries := append([]TokenEntry(nil), cfg.Tokens...)
	if cfg.TokensFile != "" {
		fromFile, err := LoadTokens(cfg.TokensFile)
		if err != nil {
			return nil, err
		}
		if len(fromFile) == 0 && cfg.JWTSecret == "" && cfg.JWTPublicKey == "" {
			return nil, fmt.Errorf("QUEEN_TOKENS_FILE %s lists no tokens, so no client could get in; add a line `<sha256-hex-of-token> <tenant> <role>` or unset QUEEN_TOKENS_FILE", cfg.TokensFile)
		}
		entries = append(entries, fromFile...)
	}
	for _, e := range entries {
		h := strings.ToLower(e.Hash)
		if _, err := hex.DecodeString(h); err != nil || len(h) != 64 {
			return nil, fmt.Errorf("token hash on line %d is not 64 hex digits", e.Line)
		}
		if e.Role == RoleNone || e.Role > RoleOperator {
			return nil, fmt.Errorf("token on line %d: no role", e.Line)
		}
		if (e.Role == RoleOperator) != (e.Tenant == OperatorTenant) {
			return nil, fmt.Errorf("token on line %d: the operator role goes with tenant %s, and only it", e.Line, OperatorTenant)
		}
		if e.Role != RoleOperator {
			if err := ValidTenant(e.Tenant); err != nil {
				return nil, fmt.Errorf("token on line %d: %v", e.Line, err)
			}
		}
		if _, dup := a.tokens[h]; dup {
			return nil, fmt.Errorf("token on line %d: the same token hash is listed twice; remove one", e.Line)
		}
		a.tokens[h] = Identity{Tenant: e.Tenant, Role: e.Role, Via: "token"}
	}
	if cfg.JWTSecret != "" {
		a.jwt.hs = []byte(cfg.JWTSecret)
		if len(cfg.JWTSecret) < MinSecretLen {
			a.warnings = append(a.warnings, fmt.Sprintf("QUEEN_JWT_SECRET is %d bytes; HS256 wants at least %d random bytes (e.g. `openssl rand -base64 48`)", len(cfg.JWTSecret), MinSecretLen))
		}
	}
	if cfg.JWTPublicKey != "" {
		k, err := ParsePublicKey(cfg.JWTPublicKey)
		if err != nil {
			return nil, err
		}
		a.jwt.rs = k
	}
	a.enabled = cfg.TokensFile != "" || len(cfg.Tokens) > 0 || a.jwt.enabled()
	return a, nil
}

// Enabled reports whether auth is on. A nil Authenticator is off.
func (a *Authenticator) Enabled() bool { return a != nil && a.enabled }

// Warnings are non-fatal configuration problems to log at start-up.
func (a *Authenticator) Warnings() []string {
	if a == nil {
		return nil
	}
	return a.warnings
}

// Describe summarizes the configuration for the start-up log (no secrets).
func (a *Authenticator) Describe() string {
	if !a.Enabled() {
		return "off"
	}
	var parts []string
	if a.file != "" || len(a.tokens) > 0 {
		parts = append(parts, fmt.Sprintf("%d static tokens", len(a.tokens)))
	}
	if algs := a.jwt.algs(); algs != "" {
		parts = append(parts, "JWT "+algs)
	}
	return strings.Join(parts, ", ")
}

// ParseBearer extracts the token of an Authorization header value
// ("Bearer <token>"; the scheme is case-insensitive).
func ParseBearer(header string) (string, error) {
	h := strings.TrimSpace(header)
	if h == "" {
		return "", errors.New("no Authorization header; send the header `Authorization: Bearer TOKEN`")
	}
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", errors.New("the Authorization header is not a Bearer token; send the header `Authorization: Bearer TOKEN`")
	}
	tok = strings.TrimSpace(tok)
	if tok == "" {
		return "", errors.New("the Bearer token is empty; send the header `Authorization: Bearer TOKEN`")
	}
	if len(tok) > MaxTokenLen {
		return "", fmt.Errorf("the Bearer token is over %d bytes", MaxTokenLen)
	}
	if strings.ContainsAny(tok, " \t\r\n") {
		return "", errors.New("the Bearer token contains whitespace; send exactly one token")
	}
	return tok, nil
}

// HashToken is the sha256 hex of a token, as written in the tokens file.
func HashToken(tok string) string {
	sum := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(sum[:])
}

// Authenticate resolves the value of an Authorization header. When auth is
// off it returns Open. Every error means 401; its text is safe to send to
// the client (it never contains the token).
//
// A token listed in the tokens file wins; otherwise a token shaped like a
// JWT is verified when a JWT key is configured.
func (a *Authenticator) Authenticate(header string) (Identity, error) {
	if !a.Enabled() {
		return Open, nil
	}
	tok, err := ParseBearer(header)
	if err != nil {
		return Identity{}, err
	}
	if id, ok := a.tokens[HashToken(tok)]; ok {
		return id, nil
	}
	if a.jwt.enabled() && LooksLikeJWT(tok) {
		return a.jwt.verify(tok)
	}
	return Identity{}, errors.New("the bearer token is not known to this server")
}

// VerifyJWT checks a compact JWT against the configured keys, without
// consulting the tokens file.
func (a *Authenticator) VerifyJWT(tok string) (Identity, error) {
	if a == nil {
		return Identity{}, errors.New("auth is not configured")
	}
	return a.jwt.verify(tok)
}
