package connector

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
)

// MaxNameLen is the longest connector name.
const MaxNameLen = 48

// maxPGName is PostgreSQL's longest identifier (NAMEDATALEN-1).
const maxPGName = 63

// Where connectors live in the replicated KV store.
//
// Documents are stored in the broker's own tenant SystemTenant, under
// DocPrefix + "<tenant>/<name>", so every node can list every tenant's
// connectors with one read, and no client can read them through the KV API
// (no token can name a tenant with a "/"). A source's pointer and lease are
// stored in the connector's own tenant, under PointerKey and LeaseKey: the
// pointer is written in the same transaction as the messages it covers, and
// a transaction acts in one tenant. The tenant's clients may read both (the
// KV API refuses their writes under __queen/).
const (
	SystemTenant = "__queen/"
	DocPrefix    = "__queen/connectors/"
)

// DocKey is the key of a document in SystemTenant.
func DocKey(tenant, name string) string { return DocPrefix + tenant + "/" + name }

// PointerKey is the key, in the connector's tenant, of a source's pointer:
// how far into the WAL its messages reach (written by the source with
// ifVersion, in the transaction that pushes them).
func PointerKey(name string) string { return DocPrefix + name + "/pointer" }

// LeaseKey is the key, in the connector's tenant, of a source's ownership
// lease (LeaseValue, with a TTL): the node that runs the source.
func LeaseKey(name string) string { return DocPrefix + name + "/lease" }

// ValidName checks a connector name: 1-48 of lowercase letters, digits, -
// and _, starting with a letter or a digit.
func ValidName(name string) error {
	if name == "" {
		return fmt.Errorf("a connector name must not be empty")
	}
	if len(name) > MaxNameLen {
		return fmt.Errorf("a connector name is at most %d characters, got %d", MaxNameLen, len(name))
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case (c == '-' || c == '_') && i > 0:
		case c == '-' || c == '_':
			return fmt.Errorf("a connector name starts with a lowercase letter or a digit, got %q", c)
		default:
			return fmt.Errorf("a connector name holds only lowercase letters, digits, - and _ (found %q at byte %d)", c, i)
		}
	}
	return nil
}

// DefaultSlotName is the slot and publication name a source gets when its
// document names none: "queen_" + the name with - turned into _. In tenant
// "default" that is all. In any other tenant the name is
// "queen__<name>_<16 hex digits>", the digits from a hash of the tenant and
// the name (the name is cut to fit 63 characters): a double underscore
// never follows "queen" in a default-tenant name, which always continues
// with a letter or digit, and the hash keeps two tenants' connectors of the
// same name apart.
func DefaultSlotName(tenant, name string) string {
	base := strings.ReplaceAll(name, "-", "_")
	if tenant == "" || tenant == "default" {
		return "queen_" + base
	}
	sum := sha256.Sum256([]byte(tenant + "\x00" + name))
	h := hex.EncodeToString(sum[:8])
	room := maxPGName - len("queen__") - 1 - len(h)
	if len(base) > room {
		base = base[:room]
	}
	return "queen__" + base + "_" + h
}

// validSlotName checks a slot or publication name: 1-63 of lowercase
// letters, digits and _ (PostgreSQL's rule for slot names).
func validSlotName(s string) error {
	if s == "" || len(s) > maxPGName {
		return fmt.Errorf("must be 1-%d characters, got %d", maxPGName, len(s))
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return fmt.Errorf("may hold only lowercase letters, digits and _ (found %q at byte %d)", c, i)
		}
	}
	return nil
}

// validIdent checks one part of a table name or a column name as the
// documents take them: 1-63 bytes of letters, digits, _ and $, not starting
// with a digit or $. Names are case-sensitive and quoted by the connectors.
func validIdent(s string) error {
	if s == "" || len(s) > maxPGName {
		return fmt.Errorf("a name is 1-%d bytes, got %d", maxPGName, len(s))
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c == '_':
		case (c >= '0' && c <= '9' || c == '$') && i > 0:
		default:
			return fmt.Errorf("%q: a name holds letters, digits, _ and $, and starts with a letter or _ (found %q at byte %d)", s, c, i)
		}
	}
	return nil
}

// validTableName checks "schema.name".
func validTableName(s string) error {
	schema, table, ok := strings.Cut(s, ".")
	if !ok || strings.Contains(table, ".") {
		return fmt.Errorf("a table is written schema.name, e.g. public.orders, got %q", s)
	}
	if err := validIdent(schema); err != nil {
		return fmt.Errorf("schema of %q: %v", s, err)
	}
	if err := validIdent(table); err != nil {
		return fmt.Errorf("table of %q: %v", s, err)
	}
	return nil
}

// SplitTable splits a validated "schema.name".
func SplitTable(s string) (schema, table string) {
	schema, table, _ = strings.Cut(s, ".")
	return schema, table
}
