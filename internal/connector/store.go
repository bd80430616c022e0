package connector

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/queen-mq/queen/internal/broker"
	"github.com/queen-mq/queen/internal/seal"
)

// Store reads and writes connector documents in the replicated KV store
// (see DocKey), through the broker's Go API. Every write is conditional on
// the version it read, so two writers never lose each other's changes.
type Store struct {
	b *broker.Broker
}

// NewStore is the document store of b.
func NewStore(b *broker.Broker) *Store { return &Store{b: b} }

// Stored is a document with the tenant it belongs to.
type Stored struct {
	Tenant string
	Doc    Document
}

// putRetries bounds the read-check-write rounds of an unconditional write
// that keeps meeting concurrent writes.
const putRetries = 8

func notFound(name string) *broker.Error {
	return &broker.Error{Code: "connector_not_found", Message: fmt.Sprintf("no connector named %q; PUT /api/v1/connectors/%s creates it", name, name)}
}

func conflict(format string, args ...any) *broker.Error {
	return &broker.Error{Code: "conflict", Message: fmt.Sprintf(format, args...)}
}

func isConditionFailed(err error) bool {
	var be *broker.Error
	return errors.As(err, &be) && be.Code == "condition_failed"
}

func decodeDoc(value []byte, version uint64) (Document, error) {
	var d Document
	if err := json.Unmarshal(value, &d); err != nil {
		return d, fmt.Errorf("decode connector document: %w", err)
	}
	d.Version = version
	d.Connection.PasswordSet = len(d.Connection.SealedPassword) > 0
	return d, nil
}

func encodeDoc(d Document) ([]byte, error) {
	d.Version = 0
	return json.Marshal(d)
}

// Get reads one document.
func (s *Store) Get(ctx context.Context, tenant, name string) (Document, bool, error) {
	e, ok, err := s.b.KVGet(ctx, SystemTenant, DocKey(tenant, name))
	if err != nil || !ok {
		return Document{}, false, err
	}
	d, err := decodeDoc(e.Value, e.Version)
	return d, err == nil, err
}

// List reads the documents of one tenant, in name order.
func (s *Store) List(ctx context.Context, tenant string) ([]Document, error) {
	all, err := s.list(ctx, DocPrefix+tenant+"/")
	if err != nil {
		return nil, err
	}
	out := make([]Document, len(all))
	for i, st := range all {
		out[i] = st.Doc
	}
	return out, nil
}

// ListAll reads every tenant's documents (the runtime's view).
func (s *Store) ListAll(ctx context.Context) ([]Stored, error) { return s.list(ctx, DocPrefix) }

func (s *Store) list(ctx context.Context, prefix string) ([]Stored, error) {
	var out []Stored
	after := ""
	for {
		page, err := s.b.KVList(ctx, SystemTenant, prefix, after, 1000)
		if err != nil {
			return nil, fmt.Errorf("list connector documents: %w", err)
		}
		for _, e := range page {
			rest := strings.TrimPrefix(e.Key, DocPrefix)
			tenant, name, ok := strings.Cut(rest, "/")
			if !ok || strings.Contains(name, "/") {
				continue
			}
			d, err := decodeDoc(e.Value, e.Version)
			if err != nil {
				return nil, fmt.Errorf("connector %q of tenant %q: %w", name, tenant, err)
			}
			out = append(out, Stored{Tenant: tenant, Doc: d})
		}
		if len(page) < 1000 {
			return out, nil
		}
		after = page[len(page)-1].Key
	}
}

// Put creates or replaces a document from a PUT body. The body's
// "version" makes it conditional (409 conflict when the stored version
// differs); a kind change is 409 kind_change; a password needs the
// broker's key (400 encryption_required). An omitted password keeps the
// stored one, "" removes it.
func (s *Store) Put(ctx context.Context, tenant, name string, body []byte) (Document, error) {
	in, err := ParseDocument(tenant, name, body)
	if err != nil {
		return Document{}, err
	}
	var sealed []byte
	if in.Password != nil && *in.Password != "" {
		sealer := s.b.Sealer()
		if sealer == nil {
			return Document{}, &broker.Error{Code: "encryption_required", Field: "connection.password",
				Message: "this broker has no QUEEN_ENCRYPTION_KEY, so it cannot store a password; start every node with the same key (openssl rand -hex 32)"}
		}
		if sealed, err = sealer.Seal([]byte(*in.Password)); err != nil {
			return Document{}, fmt.Errorf("seal the password: %w", err)
		}
	}
	for range putRetries {
		cur, exists, err := s.Get(ctx, tenant, name)
		if err != nil {
			return Document{}, err
		}
		if in.IfVersion != nil && *in.IfVersion != cur.Version {
			return Document{}, conflictVersion(*in.IfVersion, cur.Version, exists)
		}
		if exists && cur.Kind != in.Doc.Kind {
			return Document{}, &broker.Error{Code: "kind_change", Field: "kind",
				Message: fmt.Sprintf("connector %q is a %s and cannot become a %s; delete it first, or use another name", name, cur.Kind, in.Doc.Kind)}
		}
		if exists && cur.Deleting {
			return Document{}, conflict("connector %q is being deleted (its owner drops the slot); wait until it is gone, or DELETE it with ?dropSlot=false to remove it at once", name)
		}
		doc := in.Doc
		switch {
		case in.Password == nil && exists:
			doc.Connection.SealedPassword = cur.Connection.SealedPassword
		case in.Password != nil && *in.Password != "":
			doc.Connection.SealedPassword = sealed
		}
		doc.Connection.PasswordSet = len(doc.Connection.SealedPassword) > 0
		if exists {
			doc.Resync = cur.Resync
		}
		v, err := s.write(ctx, tenant, doc, cur.Version)
		if isConditionFailed(err) {
			if in.IfVersion != nil {
				return Document{}, conflict("another write of connector %q came first; read it again and send its new version", name)
			}
			continue
		}
		if err != nil {
			return Document{}, err
		}
		doc.Version = v
		return doc, nil
	}
	return Document{}, conflict("connector %q kept changing under this write; retry", name)
}

func conflictVersion(want, have uint64, exists bool) *broker.Error {
	e := conflict("the stored connector has version %d, not %d: another write came first; read it again and send its new version", have, want)
	if !exists {
		e = conflict("the connector does not exist, so version %d does not match; send version 0 (or none) to create it", want)
	}
	e.Field = "version"
	v := have
	e.CurrentVersion = &v
	return e
}

// write stores doc if the stored version is still ifVersion (0: absent).
func (s *Store) write(ctx context.Context, tenant string, doc Document, ifVersion uint64) (uint64, error) {
	b, err := encodeDoc(doc)
	if err != nil {
		return 0, err
	}
	return s.b.KVPut(ctx, SystemTenant, DocKey(tenant, doc.Name), b, &ifVersion, 0, true)
}

// update applies fn to the stored document and writes it back, retrying
// when another write came first.
func (s *Store) update(ctx context.Context, tenant, name string, fn func(d *Document) error) (Document, error) {
	for range putRetries {
		cur, exists, err := s.Get(ctx, tenant, name)
		if err != nil {
			return Document{}, err
		}
		if !exists {
			return Document{}, notFound(name)
		}
		d := cur
		if err := fn(&d); err != nil {
			return Document{}, err
		}
		v, err := s.write(ctx, tenant, d, cur.Version)
		if isConditionFailed(err) {
			continue
		}
		if err != nil {
			return Document{}, err
		}
		d.Version = v
		return d, nil
	}
	return Document{}, conflict("connector %q kept changing under this write; retry", name)
}

// Delete deletes a sink at once (gone is true). A source is marked
// Deleting for its owner to drop its slot and then remove it (gone is
// false), unless dropSlot is false: then it is removed at once and the
// slot is left to the user.
func (s *Store) Delete(ctx context.Context, tenant, name string, dropSlot bool) (gone bool, err error) {
	for range putRetries {
		cur, exists, err := s.Get(ctx, tenant, name)
		if err != nil {
			return false, err
		}
		if !exists {
			return false, notFound(name)
		}
		if cur.Kind == KindSink || !dropSlot {
			v := cur.Version
			_, err := s.b.KVDelete(ctx, SystemTenant, DocKey(tenant, name), &v, true)
			if isConditionFailed(err) {
				continue
			}
			return err == nil, err
		}
		if cur.Deleting {
			return false, nil
		}
		d := cur
		d.Deleting = true
		_, err = s.write(ctx, tenant, d, cur.Version)
		if isConditionFailed(err) {
			continue
		}
		return false, err
	}
	return false, conflict("connector %q kept changing under this delete; retry", name)
}

// Resync asks a source to drop its pointer and slot and start over from a
// new snapshot (Document.Resync grows). A sink gets 400 not_a_source.
func (s *Store) Resync(ctx context.Context, tenant, name string) (Document, error) {
	return s.update(ctx, tenant, name, func(d *Document) error {
		if d.Kind != KindSource {
			return &broker.Error{Code: "not_a_source", Message: fmt.Sprintf("connector %q is a sink; only a source can resync (to replay a queue into a sink's table, seek its consumer group)", name)}
		}
		if d.Deleting {
			return conflict("connector %q is being deleted; it cannot resync", name)
		}
		d.Resync++
		return nil
	})
}

// Remove deletes the document for good if it still has version (a
// source's owner, once it dropped what a DELETE asked it to drop). A
// document already gone is not an error.
func (s *Store) Remove(ctx context.Context, tenant, name string, version uint64) error {
	v := version
	_, err := s.b.KVDelete(ctx, SystemTenant, DocKey(tenant, name), &v, true)
	if isConditionFailed(err) {
		if _, exists, gerr := s.Get(ctx, tenant, name); gerr == nil && !exists {
			return nil
		}
		return fmt.Errorf("remove connector %q: the document changed since version %d: %w", name, version, err)
	}
	return err
}

// Unseal opens a document's password with this node's key ("" when the
// document has none). A node without the key, or with another one, gets a
// coded error "unseal".
func Unseal(sealer *seal.Sealer, d Document) (string, error) {
	if len(d.Connection.SealedPassword) == 0 {
		return "", nil
	}
	p, err := sealer.Open(d.Connection.SealedPassword)
	if err != nil {
		return "", Errorf("unseal", err, "this node cannot decrypt the connector's password; give every node the same QUEEN_ENCRYPTION_KEY")
	}
	return string(p), nil
}

// SourceState is what a source wrote about itself, read from any node.
type SourceState struct {
	Pointer json.RawMessage `json:"pointer"`
	Lease   *LeaseState     `json:"lease"`
}

// LeaseState is the holder of a source's lease and when it runs out (µs).
type LeaseState struct {
	Node      string `json:"node"`
	ExpiresAt int64  `json:"-"`
	Version   uint64 `json:"-"`
}

// State reads a source's pointer and lease.
func (s *Store) State(ctx context.Context, tenant, name string) (SourceState, error) {
	var st SourceState
	p, ok, err := s.b.KVGet(ctx, tenant, PointerKey(name))
	if err != nil {
		return st, err
	}
	if ok {
		st.Pointer = json.RawMessage(p.Value)
	}
	l, ok, err := s.b.KVGet(ctx, tenant, LeaseKey(name))
	if err != nil {
		return st, err
	}
	if ok {
		var v LeaseValue
		_ = json.Unmarshal(l.Value, &v)
		st.Lease = &LeaseState{Node: v.Node, ExpiresAt: l.ExpiresAt, Version: l.Version}
	}
	return st, nil
}
