package auth

import (
	"fmt"
	"strings"
)

// Role is what an identity may do. The tenant roles are ordered: each
// includes the rights of the ones below it. RoleOperator stands apart: it
// belongs to no tenant and grants only the cluster's own operations.
type Role int

const (
	// RoleNone grants nothing; it is the zero value.
	RoleNone Role = iota
	// RoleRead may use GET/HEAD routes (list, inspect, pop).
	RoleRead
	// RoleWrite may also push, ack, configure and use every other write.
	RoleWrite
	// RoleAdmin may also delete queues and groups and manage connectors.
	RoleAdmin
	// RoleOperator changes the cluster's membership and reads its
	// checksums; it reads and writes no tenant's data.
	RoleOperator
)

// OperatorTenant is the tenant field of an operator's token: the operator
// acts in no tenant.
const OperatorTenant = "*"

// String returns the canonical name: read, write, admin (or none).
func (r Role) String() string {
	switch r {
	case RoleRead:
		return "read"
	case RoleWrite:
		return "write"
	case RoleAdmin:
		return "admin"
	case RoleOperator:
		return "operator"
	default:
		return "none"
	}
}

// Allows reports whether r includes the rights of need. The operator role
// allows only itself, and only the operator role allows it.
func (r Role) Allows(need Role) bool {
	if r == RoleOperator || need == RoleOperator {
		return r == need
	}
	return r >= need && r > RoleNone
}

// ParseRole reads a role name: read, write, admin or operator, or Queen's
// read-only and read-write. Case is ignored.
func ParseRole(s string) (Role, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "read", "read-only":
		return RoleRead, nil
	case "write", "read-write":
		return RoleWrite, nil
	case "admin":
		return RoleAdmin, nil
	case "operator":
		return RoleOperator, nil
	}
	return RoleNone, fmt.Errorf("role %q is not one of read, write, admin, operator (or Queen's read-only, read-write)", truncate(s, 40))
}

// MaxTenantLen is the longest tenant name, as for a queue name.
const MaxTenantLen = 128

// ValidTenant checks a tenant name: 1-128 bytes of [A-Za-z0-9._:-], the rule
// for queue names.
func ValidTenant(s string) error {
	if len(s) == 0 {
		return fmt.Errorf("tenant must not be empty")
	}
	if len(s) > MaxTenantLen {
		return fmt.Errorf("tenant is %d bytes; at most %d are allowed", len(s), MaxTenantLen)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == ':' || c == '-') {
			return fmt.Errorf("tenant may contain only letters, digits and . _ : - (found %q at byte %d)", c, i)
		}
	}
	return nil
}

// truncate shortens s for an error message.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
