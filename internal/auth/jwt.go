package auth

import (
	"crypto"
	"crypto/hmac"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"time"
)

// DefaultLeeway is the clock skew tolerated on a JWT's exp and nbf.
const DefaultLeeway = 30 * time.Second

// MinRSABits is the smallest RS256 public key accepted.
const MinRSABits = 2048

// LooksLikeJWT reports whether a bearer token has the shape of a compact
// JWS: three base64url parts separated by dots (the signature may be empty,
// so that an unsigned "alg":"none" token gets a precise refusal).
func LooksLikeJWT(tok string) bool {
	if len(tok) > MaxTokenLen {
		return false
	}
	parts := strings.Split(tok, ".")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" {
		return false
	}
	for _, p := range parts {
		for i := 0; i < len(p); i++ {
			c := p[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// jwtVerifier checks HS256 and RS256 compact JWTs.
type jwtVerifier struct {
	hs     []byte         // HS256 secret; nil when not configured
	rs     *rsa.PublicKey // RS256 key; nil when not configured
	leeway time.Duration
	now    func() time.Time
}

func (v *jwtVerifier) enabled() bool { return v.hs != nil || v.rs != nil }

func (v *jwtVerifier) algs() string {
	var a []string
	if v.hs != nil {
		a = append(a, "HS256")
	}
	if v.rs != nil {
		a = append(a, "RS256")
	}
	return strings.Join(a, ", ")
}

var b64 = base64.RawURLEncoding.Strict()

type jwtHeader struct {
	Alg  *string         `json:"alg"`
	Crit json.RawMessage `json:"crit"`
}

// verify checks the signature, then exp/nbf, then the tenant and role
// claims. Its errors are messages for a 401 and never contain the token.
func (v *jwtVerifier) verify(tok string) (Identity, error) {
	if !LooksLikeJWT(tok) {
		return Identity{}, errors.New("the bearer token is not a JWT (three base64url parts separated by dots)")
	}
	i := strings.IndexByte(tok, '.')
	j := strings.LastIndexByte(tok, '.')
	h64, c64, s64 := tok[:i], tok[i+1:j], tok[j+1:]
	hb, err := b64.DecodeString(h64)
	if err != nil {
		return Identity{}, errors.New("the JWT header is not valid base64url")
	}
	var h jwtHeader
	if err := json.Unmarshal(hb, &h); err != nil {
		return Identity{}, errors.New("the JWT header is not a JSON object")
	}
	if h.Alg == nil {
		return Identity{}, errors.New("the JWT header has no \"alg\"")
	}
	if len(h.Crit) > 0 && string(h.Crit) != "null" {
		return Identity{}, errors.New("the JWT header lists \"crit\" extensions, which this server does not understand")
	}
	sig, err := b64.DecodeString(s64)
	if err != nil {
		return Identity{}, errors.New("the JWT signature is not valid base64url")
	}
	signed := tok[:j]
	switch alg := *h.Alg; {
	case alg == "HS256" && v.hs != nil:
		m := hmac.New(sha256.New, v.hs)
		m.Write([]byte(signed))
		if !hmac.Equal(sig, m.Sum(nil)) {
			return Identity{}, errors.New("the JWT signature does not verify")
		}
	case alg == "RS256" && v.rs != nil:
		sum := sha256.Sum256([]byte(signed))
		if err := rsa.VerifyPKCS1v15(v.rs, crypto.SHA256, sum[:], sig); err != nil {
			return Identity{}, errors.New("the JWT signature does not verify")
		}
	default:
		if v.algs() == "" {
			return Identity{}, errors.New("JWTs are not accepted by this server (neither QUEEN_JWT_SECRET nor QUEEN_JWT_PUBLIC_KEY is set)")
		}
		return Identity{}, fmt.Errorf("JWT alg %q is not accepted; this server accepts %s", truncate(alg, 20), v.algs())
	}

	cb, err := b64.DecodeString(c64)
	if err != nil {
		return Identity{}, errors.New("the JWT claims are not valid base64url")
	}
	var claims map[string]json.RawMessage
	if err := json.Unmarshal(cb, &claims); err != nil || claims == nil {
		return Identity{}, errors.New("the JWT claims are not a JSON object")
	}
	now := v.now()
	if exp, ok, err := numClaim(claims, "exp"); err != nil {
		return Identity{}, err
	} else if ok && secs(now) > exp+v.leeway.Seconds() {
		return Identity{}, fmt.Errorf("the JWT expired at %s; get a new token", unixTime(exp))
	}
	if nbf, ok, err := numClaim(claims, "nbf"); err != nil {
		return Identity{}, err
	} else if ok && secs(now) < nbf-v.leeway.Seconds() {
		return Identity{}, fmt.Errorf("the JWT is not valid before %s", unixTime(nbf))
	}
	roleName, err := strClaim(claims, "role")
	if err != nil {
		return Identity{}, err
	}
	role, err := ParseRole(roleName)
	if err != nil {
		return Identity{}, fmt.Errorf("the JWT claim \"role\": %v", err)
	}
	if role == RoleOperator {
		if raw, ok := claims["tenant"]; ok && string(raw) != "null" && string(raw) != `"`+OperatorTenant+`"` {
			return Identity{}, errors.New("an operator JWT carries no \"tenant\" claim (or \"*\"): the operator role belongs to no tenant")
		}
		return Identity{Tenant: OperatorTenant, Role: RoleOperator, Via: "jwt"}, nil
	}
	tenant, err := strClaim(claims, "tenant")
	if err != nil {
		return Identity{}, err
	}
	if err := ValidTenant(tenant); err != nil {
		return Identity{}, fmt.Errorf("the JWT claim \"tenant\": %v", err)
	}
	return Identity{Tenant: tenant, Role: role, Via: "jwt"}, nil
}

func strClaim(c map[string]json.RawMessage, name string) (string, error) {
	raw, ok := c[name]
	if !ok || string(raw) == "null" {
		return "", fmt.Errorf("the JWT has no %q claim; the issuer must set \"tenant\" and \"role\"", name)
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", fmt.Errorf("the JWT claim %q must be a string", name)
	}
	return s, nil
}

func numClaim(c map[string]json.RawMessage, name string) (float64, bool, error) {
	raw, ok := c[name]
	if !ok || string(raw) == "null" {
		return 0, false, nil
	}
	var f float64
	if err := json.Unmarshal(raw, &f); err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, false, fmt.Errorf("the JWT claim %q must be a number of seconds since 1970", name)
	}
	return f, true, nil
}

func secs(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

func unixTime(f float64) string {
	if f > 1e11 || f < -1e11 {
		return fmt.Sprintf("%g (seconds since 1970)", f)
	}
	return time.Unix(int64(f), 0).UTC().Format(time.RFC3339)
}

// ParsePublicKey reads an RSA public key for RS256: PEM text ("PUBLIC
// KEY", "RSA PUBLIC KEY" or a "CERTIFICATE"), or the path of a file holding
// it. PEM text whose newlines were written as \n (common in environment
// variables) is accepted too.
func ParsePublicKey(s string) (*rsa.PublicKey, error) {
	text := strings.TrimSpace(s)
	src := "QUEEN_JWT_PUBLIC_KEY"
	if !strings.Contains(text, "-----BEGIN") {
		data, err := os.ReadFile(text)
		if err != nil {
			return nil, fmt.Errorf("%s is neither PEM text nor a readable file: %w (set it to the PEM of the RS256 public key or the path of a .pem file)", src, err)
		}
		src += " file " + text
		text = string(data)
	}
	if !strings.Contains(text, "\n") && strings.Contains(text, `\n`) {
		text = strings.ReplaceAll(text, `\n`, "\n")
	}
	block, _ := pem.Decode([]byte(text))
	if block == nil {
		return nil, fmt.Errorf("%s: no PEM block found; want -----BEGIN PUBLIC KEY----- … -----END PUBLIC KEY-----", src)
	}
	var pub any
	var err error
	switch block.Type {
	case "PUBLIC KEY":
		pub, err = x509.ParsePKIXPublicKey(block.Bytes)
	case "RSA PUBLIC KEY":
		pub, err = x509.ParsePKCS1PublicKey(block.Bytes)
	case "CERTIFICATE":
		var cert *x509.Certificate
		if cert, err = x509.ParseCertificate(block.Bytes); err == nil {
			pub = cert.PublicKey
		}
	default:
		if strings.Contains(block.Type, "PRIVATE") {
			return nil, fmt.Errorf("%s holds a private key; give the broker only the public key (`openssl rsa -in key.pem -pubout`)", src)
		}
		return nil, fmt.Errorf("%s: PEM block %q is not a public key; want PUBLIC KEY, RSA PUBLIC KEY or CERTIFICATE", src, block.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", src, err)
	}
	rk, ok := pub.(*rsa.PublicKey)
	if !ok {
		return nil, fmt.Errorf("%s: the key is %T, not RSA; RS256 needs an RSA public key", src, pub)
	}
	if rk.N.BitLen() < MinRSABits {
		return nil, fmt.Errorf("%s: the RSA key has %d bits; use at least %d", src, rk.N.BitLen(), MinRSABits)
	}
	return rk, nil
}
