package auth

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// h is the sha256 hex of a test token.
func h(tok string) string { return HashToken(tok) }

func TestHashTokenMatchesSha256sum(t *testing.T) {
	// printf %s mytoken | sha256sum (the example of docs/auth.md)
	const want = "1a17ea3569204d6c4114794ca73fa257457fc0612928c7bf024801659b77dba8"
	if got := HashToken("mytoken"); got != want {
		t.Fatalf("HashToken = %q, want %q", got, want)
	}
}

func TestParseTokens(t *testing.T) {
	A, B, C := h("a-token"), h("b-token"), h("c-token")
	cases := []struct {
		name    string
		file    string
		want    []TokenEntry
		wantErr string // substring; "" means success
	}{
		{name: "lines with comments and blanks",
			file: "# tokens\n\n" + A + " tenant-a admin\n  " + B + "\ttenant.b\tread  # reader\r\n" + C + " c:1 write\n",
			want: []TokenEntry{{A, "tenant-a", RoleAdmin, 3}, {B, "tenant.b", RoleRead, 4}, {C, "c:1", RoleWrite, 5}}},
		{name: "queen role names", file: A + " t read-only\n" + B + " t read-write\n" + C + " t ADMIN\n",
			want: []TokenEntry{{A, "t", RoleRead, 1}, {B, "t", RoleWrite, 2}, {C, "t", RoleAdmin, 3}}},
		{name: "uppercase hash is normalized", file: strings.ToUpper(A) + " t read\n",
			want: []TokenEntry{{A, "t", RoleRead, 1}}},
		{name: "empty file", file: "", want: nil},
		{name: "only comments", file: "# nothing\n\n   # here\n", want: nil},
		{name: "utf8 bom", file: "\xef\xbb\xbf" + A + " t read\n", want: []TokenEntry{{A, "t", RoleRead, 1}}},
		{name: "json array",
			file: "[\n {\"tokenHash\": \"" + A + "\", \"tenant\": \"a\", \"role\": \"admin\"},\n {\"tokenHash\": \"" + B + "\", \"tenant\": \"b\", \"role\": \"read-only\"}\n]\n",
			want: []TokenEntry{{A, "a", RoleAdmin, 2}, {B, "b", RoleRead, 3}}},
		{name: "json empty array", file: " []", want: nil},

		{name: "two fields", file: "# c\n" + A + " tenant\n", wantErr: "tokens:2: found 2 fields, want 3"},
		{name: "four fields", file: A + " t read extra\n", wantErr: "tokens:1: found 4 fields"},
		{name: "raw token instead of hash", file: "mysecrettoken t read\n", wantErr: "tokens:1: the token hash has 13 characters"},
		{name: "non-hex hash", file: strings.Repeat("g", 64) + " t read\n", wantErr: "tokens:1: the token hash is not hexadecimal"},
		{name: "bad role", file: A + " t superuser\n", wantErr: "tokens:1: role \"superuser\" is not one of"},
		{name: "bad tenant", file: A + " ten/ant read\n", wantErr: "tokens:1: tenant may contain only"},
		{name: "long tenant", file: A + " " + strings.Repeat("t", 129) + " read\n", wantErr: "tenant is 129 bytes"},
		{name: "duplicate hash", file: A + " a read\n\n" + A + " b admin\n", wantErr: "tokens:3: the same token hash is already listed on line 1"},
		{name: "json syntax", file: "[\n{\"tokenHash\": \n", wantErr: "invalid JSON"},
		{name: "json unknown field", file: `[{"tokenHash":"` + A + `","tenant":"a","role":"read","token":"x"}]`, wantErr: `entry 0: json: unknown field "token"`},
		{name: "json missing role", file: `[{"tokenHash":"` + A + `","tenant":"a"}]`, wantErr: `"role" is missing`},
		{name: "json missing tenant", file: `[{"tokenHash":"` + A + `","role":"read"}]`, wantErr: `"tenant" is missing`},
		{name: "json missing hash", file: `[{"tenant":"a","role":"read"}]`, wantErr: `"tokenHash" is missing`},
		{name: "json wrong type", file: `[{"tokenHash":"` + A + `","tenant":"a","role":1}]`, wantErr: "entry 0"},
		{name: "json not objects", file: `["x"]`, wantErr: "entry 0"},
		{name: "json trailing text", file: `[] []`, wantErr: "text after the JSON array"},
		{name: "json bad entry names its line", file: "[\n{\"tokenHash\":\"" + A + "\",\"tenant\":\"a\",\"role\":\"read\"},\n{\"tokenHash\":\"" + B + "\",\"tenant\":\"a\",\"role\":\"root\"}]", wantErr: "tokens:3: entry 1: role"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseTokens("tokens", []byte(tc.file))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %d entries %+v, want %+v", len(got), got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("entry %d = %+v, want %+v", i, got[i], tc.want[i])
				}
			}
		})
	}
}

// TestParseTokensNeverEchoesHashField: a raw token pasted into the hash
// column must not appear in the error (it would end up in logs).
func TestParseTokensNeverEchoesHashField(t *testing.T) {
	for _, secret := range []string{"s3cr3t-token-value", strings.Repeat("z", 64)} {
		_, err := ParseTokens("f", []byte(secret+" t read\n"))
		if err == nil || strings.Contains(err.Error(), secret) {
			t.Fatalf("err = %v", err)
		}
	}
}

func TestLoadTokensAndNew(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "tokens")
	if err := os.WriteFile(good, []byte(h("tok-a")+" a write\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, []byte("# none yet\n"), 0o600)
	bad := filepath.Join(dir, "bad")
	os.WriteFile(bad, []byte(h("x")+" a\n"), 0o600)

	cases := []struct {
		name    string
		cfg     Config
		enabled bool
		wantErr string
	}{
		{"nothing configured is open", Config{}, false, ""},
		{"tokens file", Config{TokensFile: good}, true, ""},
		{"missing file", Config{TokensFile: filepath.Join(dir, "nope")}, false, "QUEEN_TOKENS_FILE"},
		{"malformed file names the line", Config{TokensFile: bad}, false, bad + ":1: found 2 fields"},
		{"empty file alone locks everyone out", Config{TokensFile: empty}, false, "lists no tokens"},
		{"empty file with a JWT secret is fine", Config{TokensFile: empty, JWTSecret: strings.Repeat("k", 32)}, true, ""},
		{"jwt secret", Config{JWTSecret: "short"}, true, ""},
		{"bad public key", Config{JWTPublicKey: "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"}, false, "QUEEN_JWT_PUBLIC_KEY"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, err := New(tc.cfg)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if a.Enabled() != tc.enabled {
				t.Fatalf("Enabled = %v", a.Enabled())
			}
		})
	}
	a, _ := New(Config{JWTSecret: "short"})
	if len(a.Warnings()) != 1 || !strings.Contains(a.Warnings()[0], "QUEEN_JWT_SECRET is 5 bytes") {
		t.Fatalf("warnings = %q", a.Warnings())
	}
	var nilA *Authenticator
	if nilA.Enabled() {
		t.Fatal("nil authenticator enabled")
	}
	if id, err := nilA.Authenticate(""); err != nil || id != Open {
		t.Fatalf("open mode: %+v %v", id, err)
	}
}

func TestAuthenticateTokens(t *testing.T) {
	a, err := New(Config{Tokens: []TokenEntry{
		{Hash: h("reader"), Tenant: "a", Role: RoleRead, Line: 1},
		{Hash: h("admin"), Tenant: "b", Role: RoleAdmin, Line: 2},
	}})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		header  string
		want    Identity
		wantErr string
	}{
		{"Bearer reader", Identity{"a", RoleRead, "token"}, ""},
		{"bearer admin", Identity{"b", RoleAdmin, "token"}, ""},
		{"BEARER   admin  ", Identity{"b", RoleAdmin, "token"}, ""},
		{"", Identity{}, "no Authorization header"},
		{"Bearer", Identity{}, "not a Bearer token"},
		{"Bearer ", Identity{}, "not a Bearer token"},
		{"Basic YWRtaW46eA==", Identity{}, "not a Bearer token"},
		{"Bearer nope", Identity{}, "not known"},
		{"Bearer admin extra", Identity{}, "whitespace"},
		{"Bearer " + strings.Repeat("x", MaxTokenLen+1), Identity{}, "over"},
		// A JWT-shaped token with no JWT key configured is just unknown.
		{"Bearer eyJhbGciOiJub25lIn0.e30.", Identity{}, "not known"},
	}
	for _, tc := range cases {
		id, err := a.Authenticate(tc.header)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%.40q: err = %v, want %q", tc.header, err, tc.wantErr)
			}
			if err != nil && strings.Contains(err.Error(), "nope") {
				t.Errorf("error echoes the token: %v", err)
			}
			continue
		}
		if err != nil || id != tc.want {
			t.Errorf("%q: %+v %v, want %+v", tc.header, id, err, tc.want)
		}
	}
}

func TestRoles(t *testing.T) {
	for _, tc := range []struct {
		have, need Role
		ok         bool
	}{
		{RoleRead, RoleRead, true}, {RoleRead, RoleWrite, false}, {RoleWrite, RoleRead, true},
		{RoleWrite, RoleAdmin, false}, {RoleAdmin, RoleAdmin, true}, {RoleNone, RoleNone, false},
	} {
		if got := tc.have.Allows(tc.need); got != tc.ok {
			t.Errorf("%v.Allows(%v) = %v", tc.have, tc.need, got)
		}
	}
}
