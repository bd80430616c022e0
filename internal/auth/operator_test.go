package auth

import (
	"strings"
	"testing"
)

// TestOperatorRole: the operator role belongs to no tenant (tokens file
// tenant "*", a JWT without a tenant), allows only itself, and no tenant
// role allows it.
func TestOperatorRole(t *testing.T) {
	for _, c := range []struct {
		r, need Role
		want    bool
	}{
		{RoleOperator, RoleOperator, true},
		{RoleAdmin, RoleOperator, false},
		{RoleWrite, RoleOperator, false},
		{RoleOperator, RoleRead, false},
		{RoleOperator, RoleWrite, false},
		{RoleOperator, RoleAdmin, false},
		{RoleAdmin, RoleAdmin, true},
		{RoleNone, RoleNone, false},
	} {
		if got := c.r.Allows(c.need); got != c.want {
			t.Errorf("%v.Allows(%v) = %v, want %v", c.r, c.need, got, c.want)
		}
	}

	op, adm := h("op-token"), h("adm-token")
	entries, err := ParseTokens("tokens", []byte(op+" * operator\n"+adm+" alpha admin\n"))
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(Config{Tokens: entries, JWTSecret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	id, err := a.Authenticate("Bearer op-token")
	if err != nil || !id.IsOperator() || id.Tenant != OperatorTenant {
		t.Fatalf("operator token: %+v %v", id, err)
	}
	if id, _ := a.Authenticate("Bearer adm-token"); id.IsOperator() {
		t.Fatalf("a tenant admin is an operator: %+v", id)
	}
	for _, bad := range []struct{ line, want string }{
		{op + " alpha operator", "belongs to no tenant"},
		{op + " * admin", "only for the operator role"},
		{op + " * read", "only for the operator role"},
	} {
		if _, err := ParseTokens("tokens", []byte(bad.line+"\n")); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%q: %v, want an error saying %q", bad.line[65:], err, bad.want)
		}
	}
	if _, err := New(Config{Tokens: []TokenEntry{{Hash: op, Tenant: "alpha", Role: RoleOperator, Line: 1}}}); err == nil {
		t.Error("New took an operator entry with a tenant")
	}

	hs := map[string]any{"alg": "HS256", "typ": "JWT"}
	secret := []byte(testSecret)
	for _, c := range []struct {
		claims  map[string]any
		wantErr string
	}{
		{map[string]any{"role": "operator"}, ""},
		{map[string]any{"role": "operator", "tenant": "*"}, ""},
		{map[string]any{"role": "operator", "tenant": "alpha"}, "no \"tenant\" claim"},
		{map[string]any{"role": "admin"}, "no \"tenant\" claim"},
	} {
		id, err := a.VerifyJWT(makeJWT(t, hs, c.claims, secret))
		if c.wantErr == "" {
			if err != nil || !id.IsOperator() || id.Tenant != OperatorTenant {
				t.Errorf("JWT %v: %+v %v", c.claims, id, err)
			}
		} else if err == nil || !strings.Contains(err.Error(), c.wantErr) {
			t.Errorf("JWT %v: %+v %v, want an error with %q", c.claims, id, err, c.wantErr)
		}
	}
}
