package auth

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

const testSecret = "0123456789abcdef0123456789abcdef-test-secret"

var (
	rsaOnce  sync.Once
	rsaKey   *rsa.PrivateKey
	rsaOther *rsa.PrivateKey
)

// testRSA returns two 2048-bit keys, generated once per test binary.
func testRSA(t testing.TB) (*rsa.PrivateKey, *rsa.PrivateKey) {
	rsaOnce.Do(func() {
		var err error
		if rsaKey, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
			panic(err)
		}
		if rsaOther, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
			panic(err)
		}
	})
	return rsaKey, rsaOther
}

func pubPEM(t testing.TB, k *rsa.PublicKey) string {
	der, err := x509.MarshalPKIXPublicKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
}

func enc(v any) string {
	var b []byte
	switch x := v.(type) {
	case string:
		b = []byte(x)
	default:
		b, _ = json.Marshal(x)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// makeJWT builds a compact JWT. key is a []byte (HS256), *rsa.PrivateKey
// (RS256) or nil (no signature). header and claims are marshalled unless
// they are strings, which are used verbatim.
func makeJWT(t testing.TB, header, claims any, key any) string {
	signed := enc(header) + "." + enc(claims)
	var sig []byte
	switch k := key.(type) {
	case []byte:
		m := hmac.New(sha256.New, k)
		m.Write([]byte(signed))
		sig = m.Sum(nil)
	case *rsa.PrivateKey:
		sum := sha256.Sum256([]byte(signed))
		var err error
		if sig, err = rsa.SignPKCS1v15(rand.Reader, k, crypto.SHA256, sum[:]); err != nil {
			t.Fatal(err)
		}
	}
	return signed + "." + base64.RawURLEncoding.EncodeToString(sig)
}

func TestJWT(t *testing.T) {
	priv, other := testRSA(t)
	now := time.Date(2026, 10, 3, 6, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	hsOnly, err := New(Config{JWTSecret: testSecret, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	rsOnly, err := New(Config{JWTPublicKey: pubPEM(t, &priv.PublicKey), Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	both, err := New(Config{JWTSecret: testSecret, JWTPublicKey: pubPEM(t, &priv.PublicKey), Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	hs := map[string]any{"alg": "HS256", "typ": "JWT"}
	rs := map[string]any{"alg": "RS256", "typ": "JWT"}
	ok := map[string]any{"tenant": "acme", "role": "write", "exp": now.Add(time.Hour).Unix(), "nbf": now.Add(-time.Minute).Unix()}
	with := func(k string, v any) map[string]any {
		c := map[string]any{}
		for kk, vv := range ok {
			c[kk] = vv
		}
		if v == nil {
			delete(c, k)
		} else {
			c[k] = v
		}
		return c
	}
	secret := []byte(testSecret)
	pubAsSecret := []byte(pubPEM(t, &priv.PublicKey))
	acmeWrite := Identity{Tenant: "acme", Role: RoleWrite, Via: "jwt"}

	cases := []struct {
		name    string
		a       *Authenticator
		tok     string
		want    Identity
		wantErr string
	}{
		{"HS256 valid", hsOnly, makeJWT(t, hs, ok, secret), acmeWrite, ""},
		{"RS256 valid", rsOnly, makeJWT(t, rs, ok, priv), acmeWrite, ""},
		{"both: HS256", both, makeJWT(t, hs, ok, secret), acmeWrite, ""},
		{"both: RS256", both, makeJWT(t, rs, ok, priv), acmeWrite, ""},
		{"no exp or nbf", hsOnly, makeJWT(t, hs, map[string]any{"tenant": "t", "role": "admin"}, secret), Identity{"t", RoleAdmin, "jwt"}, ""},
		{"queen role read-only", hsOnly, makeJWT(t, hs, with("role", "read-only"), secret), Identity{"acme", RoleRead, "jwt"}, ""},
		{"fractional exp", hsOnly, makeJWT(t, hs, with("exp", float64(now.Unix())+0.5), secret), acmeWrite, ""},
		{"expired within leeway", hsOnly, makeJWT(t, hs, with("exp", now.Add(-20*time.Second).Unix()), secret), acmeWrite, ""},
		{"nbf within leeway", hsOnly, makeJWT(t, hs, with("nbf", now.Add(20*time.Second).Unix()), secret), acmeWrite, ""},
		{"extra header fields", hsOnly, makeJWT(t, map[string]any{"alg": "HS256", "kid": "k1", "crit": nil}, ok, secret), acmeWrite, ""},

		{"expired", hsOnly, makeJWT(t, hs, with("exp", now.Add(-time.Minute).Unix()), secret), Identity{}, "expired at 2026-10-03T05:59:00Z"},
		{"expired RS256", rsOnly, makeJWT(t, rs, with("exp", now.Add(-time.Hour).Unix()), priv), Identity{}, "expired"},
		{"not yet valid", hsOnly, makeJWT(t, hs, with("nbf", now.Add(time.Minute).Unix()), secret), Identity{}, "not valid before"},
		{"exp is a string", hsOnly, makeJWT(t, hs, with("exp", "tomorrow"), secret), Identity{}, `"exp" must be a number`},
		{"huge exp", hsOnly, makeJWT(t, hs, with("exp", 1e300), secret), acmeWrite, ""},
		{"alg none", both, makeJWT(t, map[string]any{"alg": "none"}, ok, nil), Identity{}, `alg "none" is not accepted`},
		{"alg none with signature", both, makeJWT(t, map[string]any{"alg": "none"}, ok, secret), Identity{}, `alg "none" is not accepted`},
		{"HS256 when only RS256", rsOnly, makeJWT(t, hs, ok, secret), Identity{}, `alg "HS256" is not accepted; this server accepts RS256`},
		{"HS256 signed with the public key (key confusion)", rsOnly, makeJWT(t, hs, ok, pubAsSecret), Identity{}, `alg "HS256" is not accepted`},
		{"RS256 when only HS256", hsOnly, makeJWT(t, rs, ok, priv), Identity{}, `alg "RS256" is not accepted; this server accepts HS256`},
		{"alg lowercase", hsOnly, makeJWT(t, map[string]any{"alg": "hs256"}, ok, secret), Identity{}, "not accepted"},
		{"alg ES256", both, makeJWT(t, map[string]any{"alg": "ES256"}, ok, secret), Identity{}, "not accepted"},
		{"alg missing", hsOnly, makeJWT(t, map[string]any{"typ": "JWT"}, ok, secret), Identity{}, `no "alg"`},
		{"alg not a string", hsOnly, makeJWT(t, map[string]any{"alg": 256}, ok, secret), Identity{}, "header is not a JSON object"},
		{"crit header", hsOnly, makeJWT(t, map[string]any{"alg": "HS256", "crit": []string{"b64"}}, ok, secret), Identity{}, "crit"},
		{"HS256 wrong secret", hsOnly, makeJWT(t, hs, ok, []byte("another secret of enough length!!")), Identity{}, "signature does not verify"},
		{"RS256 wrong key", rsOnly, makeJWT(t, rs, ok, other), Identity{}, "signature does not verify"},
		{"HS256 tampered claims", hsOnly, tamper(makeJWT(t, hs, ok, secret), with("tenant", "evil")), Identity{}, "signature does not verify"},
		{"RS256 tampered claims", rsOnly, tamper(makeJWT(t, rs, ok, priv), with("role", "admin")), Identity{}, "signature does not verify"},
		{"RS256 empty signature", rsOnly, makeJWT(t, rs, ok, nil), Identity{}, "signature does not verify"},
		{"missing tenant", hsOnly, makeJWT(t, hs, with("tenant", nil), secret), Identity{}, `no "tenant" claim`},
		{"missing role", hsOnly, makeJWT(t, hs, with("role", nil), secret), Identity{}, `no "role" claim`},
		{"null tenant", hsOnly, makeJWT(t, hs, `{"tenant":null,"role":"read"}`, secret), Identity{}, `no "tenant" claim`},
		{"tenant not a string", hsOnly, makeJWT(t, hs, with("tenant", 7), secret), Identity{}, `"tenant" must be a string`},
		{"bad tenant name", hsOnly, makeJWT(t, hs, with("tenant", "a/b"), secret), Identity{}, `claim "tenant": tenant may contain only`},
		{"empty tenant", hsOnly, makeJWT(t, hs, with("tenant", ""), secret), Identity{}, "must not be empty"},
		{"unknown role", hsOnly, makeJWT(t, hs, with("role", "root"), secret), Identity{}, `claim "role"`},
		{"roles array instead of role", hsOnly, makeJWT(t, hs, with("role", []string{"admin"}), secret), Identity{}, `"role" must be a string`},
		{"claims not an object", hsOnly, makeJWT(t, hs, "[1,2]", secret), Identity{}, "claims are not a JSON object"},
		{"claims null", hsOnly, makeJWT(t, hs, "null", secret), Identity{}, "claims are not a JSON object"},
		{"claims not json", hsOnly, makeJWT(t, hs, "{", secret), Identity{}, "claims are not a JSON object"},
		{"padded base64", hsOnly, makeJWT(t, hs, ok, secret) + "=", Identity{}, "not a JWT"},
		{"two parts", hsOnly, "eyJhbGciOiJIUzI1NiJ9.e30", Identity{}, "not a JWT"},
		{"header not base64 json", hsOnly, "aGVsbG8.e30.", Identity{}, "header is not a JSON object"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			id, err := tc.a.VerifyJWT(tc.tok)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q (identity %+v)", err, tc.wantErr, id)
				}
				// Through Authenticate it is the same refusal.
				if _, err2 := tc.a.Authenticate("Bearer " + tc.tok); err2 == nil {
					t.Fatal("Authenticate accepted what VerifyJWT refused")
				}
				return
			}
			if err != nil || id != tc.want {
				t.Fatalf("got %+v, %v; want %+v", id, err, tc.want)
			}
			if id2, err := tc.a.Authenticate("Bearer " + tc.tok); err != nil || id2 != tc.want {
				t.Fatalf("Authenticate: %+v, %v", id2, err)
			}
		})
	}
}

// tamper replaces the claims of a signed token, keeping its signature.
func tamper(tok string, claims any) string {
	p := strings.Split(tok, ".")
	return p[0] + "." + enc(claims) + "." + p[2]
}

// TestTokensFileWinsOverJWT: a token listed in the tokens file is resolved
// by its hash even if it looks like a JWT.
func TestTokensFileWinsOverJWT(t *testing.T) {
	jwtShaped := "aaaa.bbbb.cccc"
	a, err := New(Config{JWTSecret: testSecret, Tokens: []TokenEntry{{Hash: HashToken(jwtShaped), Tenant: "x", Role: RoleRead}}})
	if err != nil {
		t.Fatal(err)
	}
	if id, err := a.Authenticate("Bearer " + jwtShaped); err != nil || id.Tenant != "x" || id.Via != "token" {
		t.Fatalf("%+v %v", id, err)
	}
	if _, err := a.Authenticate("Bearer aaaa.bbbb.dddd"); err == nil || !strings.Contains(err.Error(), "JWT") {
		t.Fatalf("unlisted JWT-shaped token: %v", err)
	}
}

func TestParsePublicKey(t *testing.T) {
	priv, _ := testRSA(t)
	pkix := pubPEM(t, &priv.PublicKey)
	pkcs1 := string(pem.EncodeToMemory(&pem.Block{Type: "RSA PUBLIC KEY", Bytes: x509.MarshalPKCS1PublicKey(&priv.PublicKey)}))
	privPEM := string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(priv)}))
	small, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ecDER, _ := x509.MarshalPKIXPublicKey(&ec.PublicKey)
	ecPEM := string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: ecDER}))
	dir := t.TempDir()
	path := filepath.Join(dir, "pub.pem")
	os.WriteFile(path, []byte(pkix), 0o600)

	cases := []struct {
		name, in, wantErr string
	}{
		{"pkix pem", pkix, ""},
		{"pkcs1 pem", pkcs1, ""},
		{"escaped newlines", strings.ReplaceAll(pkix, "\n", `\n`), ""},
		{"path", path, ""},
		{"path with spaces around", "  " + path + "\n", ""},
		{"missing path", filepath.Join(dir, "nope.pem"), "neither PEM text nor a readable file"},
		{"private key", privPEM, "holds a private key"},
		{"small key", pubPEM(t, &small.PublicKey), "has 1024 bits"},
		{"ec key", ecPEM, "not RSA"},
		{"garbage pem", "-----BEGIN PUBLIC KEY-----\nnot base64!\n-----END PUBLIC KEY-----\n", "no PEM block"},
		{"other block", "-----BEGIN FOO-----\nAAAA\n-----END FOO-----\n", `PEM block "FOO"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			k, err := ParsePublicKey(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !k.Equal(&priv.PublicKey) {
				t.Fatal("wrong key")
			}
		})
	}
}

func TestLooksLikeJWT(t *testing.T) {
	for s, want := range map[string]bool{
		"a.b.c": true, "a.b.": true, "eyJ-_0.eyJ.sig": true,
		"a.b": false, ".b.c": false, "a..c": false, "a.b.c.d": false, "a.b.c=": false,
		"a b.c.d": false, "": false, "a+b.c.d": false,
	} {
		if got := LooksLikeJWT(s); got != want {
			t.Errorf("LooksLikeJWT(%q) = %v", s, got)
		}
	}
}
