package auth

import (
	"strings"
	"testing"
	"time"
)

// FuzzAuthenticate feeds arbitrary Authorization header values (and bare
// tokens) to an authenticator with a tokens entry, an HS256 secret and an
// RS256 key. It must never panic, and anything it accepts must carry a
// valid tenant and role.
//
//	go test ./internal/auth/ -run '^$' -fuzz FuzzAuthenticate -fuzztime 30s
func FuzzAuthenticate(f *testing.F) {
	priv, _ := testRSA(f)
	now := time.Date(2026, 10, 3, 6, 0, 0, 0, time.UTC)
	a, err := New(Config{
		Tokens:       []TokenEntry{{Hash: HashToken("static-token"), Tenant: "t", Role: RoleRead}},
		JWTSecret:    testSecret,
		JWTPublicKey: pubPEM(f, &priv.PublicKey),
		Now:          func() time.Time { return now },
	})
	if err != nil {
		f.Fatal(err)
	}
	claims := map[string]any{"tenant": "acme", "role": "admin", "exp": now.Add(time.Hour).Unix()}
	for _, s := range []string{
		"", "Bearer", "Bearer ", "Bearer static-token", "bearer static-token", "Basic Zm9vOmJhcg==",
		"Bearer " + makeJWT(f, map[string]any{"alg": "HS256"}, claims, []byte(testSecret)),
		"Bearer " + makeJWT(f, map[string]any{"alg": "RS256"}, claims, priv),
		"Bearer " + makeJWT(f, map[string]any{"alg": "none"}, claims, nil),
		"Bearer " + makeJWT(f, map[string]any{"alg": "HS256"}, `{"tenant":1,"role":null,"exp":"x"}`, []byte(testSecret)),
		"Bearer " + makeJWT(f, map[string]any{"alg": "HS256", "crit": []string{"x"}}, claims, []byte(testSecret)),
		"Bearer " + makeJWT(f, `{"alg":"HS256"`, claims, []byte(testSecret)),
		"Bearer " + makeJWT(f, map[string]any{"alg": "HS256"}, `{"tenant":"a","role":"read","exp":1e309}`, []byte(testSecret)),
		"Bearer a.b.c", "Bearer ..", "Bearer a..", "Bearer e30.e30.", "Bearer \x00.\xff.\n",
		"Bearer " + strings.Repeat("A", 100) + "." + strings.Repeat("B", 100) + "." + strings.Repeat("C", 342),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, header string) {
		check := func(id Identity, err error) {
			if err != nil {
				if err.Error() == "" {
					t.Fatal("empty error message")
				}
				return
			}
			if ValidTenant(id.Tenant) != nil || !id.Role.Allows(RoleRead) || id.Role > RoleAdmin {
				t.Fatalf("accepted %q as %+v", header, id)
			}
		}
		check(a.Authenticate(header))
		check(a.VerifyJWT(header))
		check(a.VerifyJWT(strings.TrimPrefix(header, "Bearer ")))
		ParseBearer(header)
		LooksLikeJWT(header)
		ParseTokens("fuzz", []byte(header))
	})
}
