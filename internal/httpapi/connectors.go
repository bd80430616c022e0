package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/queen-mq/queen/internal/broker"
	"github.com/queen-mq/queen/internal/connector"
)

// The connector routes (docs/http-api.md, "Connectors"). Documents are read and
// written through connector.Store (the replicated KV store); the status is
// this node's, from Config.Connectors.

func (s *Server) connectorRoutes(handle func(string, http.HandlerFunc)) {
	handle("GET /api/v1/connectors", s.handleConnectorList)
	handle("GET /api/v1/connectors/{name}", s.handleConnectorGet)
	handle("PUT /api/v1/connectors/{name}", s.handleConnectorPut)
	handle("DELETE /api/v1/connectors/{name}", s.handleConnectorDelete)
	handle("POST /api/v1/connectors/{name}/resync", s.handleConnectorResync)
}

// connectorView is a document as a read shows it: the password replaced
// by passwordSet, this node's status and, for a source, its state.
type connectorView struct {
	connector.Document
	Status connector.Status `json:"status"`
	State  *sourceStateView `json:"state,omitempty"`
}

type sourceStateView struct {
	Pointer json.RawMessage `json:"pointer"`
	Lease   *leaseView      `json:"lease"`
}

type leaseView struct {
	Node      string `json:"node"`
	ExpiresAt string `json:"expiresAt"`
}

func (s *Server) view(ctx context.Context, tenant string, d connector.Document) (connectorView, error) {
	d.Connection.PasswordSet = len(d.Connection.SealedPassword) > 0
	d.Connection.SealedPassword = nil
	v := connectorView{Document: d, Status: s.cfg.Connectors.Status(tenant, d)}
	if d.Kind == connector.KindSource {
		st, err := s.connStore.State(ctx, tenant, d.Name)
		if err != nil {
			return v, err
		}
		v.State = &sourceStateView{Pointer: st.Pointer}
		if v.State.Pointer == nil {
			v.State.Pointer = json.RawMessage("null")
		}
		if st.Lease != nil {
			v.State.Lease = &leaseView{Node: st.Lease.Node, ExpiresAt: formatMicros(st.Lease.ExpiresAt)}
		}
	}
	return v, nil
}

func connectorNotFound(name string) *broker.Error {
	return &broker.Error{Code: "connector_not_found", Message: fmt.Sprintf("no connector named %q; PUT /api/v1/connectors/%s creates it", name, name)}
}

// connectorName is the path's name; a name that breaks the naming rule
// cannot exist, so it is not found.
func connectorName(w http.ResponseWriter, r *http.Request) (string, bool) {
	name := r.PathValue("name")
	if connector.ValidName(name) != nil {
		writeError(w, connectorNotFound(name))
		return "", false
	}
	return name, true
}

func (s *Server) handleConnectorList(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := requestContext(r)
	defer cancel()
	tenant := s.tenant(r)
	docs, err := s.connStore.List(ctx, tenant)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]connectorView, 0, len(docs))
	for _, d := range docs {
		v, err := s.view(ctx, tenant, d)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		out = append(out, v)
	}
	writeJSON(w, http.StatusOK, map[string]any{"connectors": out})
}

func (s *Server) handleConnectorGet(w http.ResponseWriter, r *http.Request) {
	name, ok := connectorName(w, r)
	if !ok {
		return
	}
	ctx, cancel := requestContext(r)
	defer cancel()
	tenant := s.tenant(r)
	d, found, err := s.connStore.Get(ctx, tenant, name)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if !found {
		writeError(w, connectorNotFound(name))
		return
	}
	s.reply(ctx, w, r, http.StatusOK, tenant, d)
}

func (s *Server) reply(ctx context.Context, w http.ResponseWriter, r *http.Request, status int, tenant string, d connector.Document) {
	v, err := s.view(ctx, tenant, d)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, status, v)
}

func (s *Server) handleConnectorPut(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	ctx, cancel := requestContext(r)
	defer cancel()
	tenant := s.tenant(r)
	d, err := s.connStore.Put(ctx, tenant, name, body)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.kickConnectors()
	s.reply(ctx, w, r, http.StatusOK, tenant, d)
}

func (s *Server) kickConnectors() {
	if s.cfg.Connectors != nil {
		s.cfg.Connectors.Kick()
	}
}

func (s *Server) handleConnectorDelete(w http.ResponseWriter, r *http.Request) {
	name, ok := connectorName(w, r)
	if !ok {
		return
	}
	dropSlot := true
	switch v := qStr(r, "dropSlot"); v {
	case "", "true", "1":
	case "false", "0":
		dropSlot = false
	default:
		writeError(w, &broker.Error{Code: "invalid_parameter", Field: "dropSlot", Message: fmt.Sprintf("dropSlot must be true or false, got %q", v)})
		return
	}
	ctx, cancel := requestContext(r)
	defer cancel()
	gone, err := s.connStore.Delete(ctx, s.tenant(r), name, dropSlot)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.kickConnectors()
	if gone {
		writeJSON(w, http.StatusOK, map[string]any{"name": name, "deleted": true})
		return
	}
	writeJSON(w, http.StatusAccepted, map[string]any{"name": name, "deleted": false, "deleting": true,
		"message": "the source's owner drops its slot (and the publication it manages), then the connector is gone; ?dropSlot=false removes it at once"})
}

func (s *Server) handleConnectorResync(w http.ResponseWriter, r *http.Request) {
	name, ok := connectorName(w, r)
	if !ok {
		return
	}
	ctx, cancel := requestContext(r)
	defer cancel()
	tenant := s.tenant(r)
	d, err := s.connStore.Resync(ctx, tenant, name)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.kickConnectors()
	s.reply(ctx, w, r, http.StatusAccepted, tenant, d)
}

// pgStatus is the pg block of /status: this node's phase of each of the
// tenant's connectors, from this node's own state (no leader needed).
func (s *Server) pgStatus(r *http.Request) map[string]any {
	rt := s.cfg.Connectors
	enabled := rt != nil && rt.Settings().Enabled
	block := map[string]any{"enabled": enabled, "connectors": []any{}}
	ctx, cancel := context.WithTimeout(broker.AllowStale(r.Context()), 5*time.Second)
	defer cancel()
	tenant := s.tenant(r)
	docs, err := s.connStore.List(ctx, tenant)
	if err != nil {
		block["error"] = err.Error()
		return block
	}
	list := make([]map[string]any, 0, len(docs))
	for _, d := range docs {
		st := rt.Status(tenant, d)
		item := map[string]any{"name": d.Name, "kind": d.Kind, "phase": st.Phase, "version": d.Version}
		if st.Code != "" {
			item["code"], item["message"] = st.Code, st.Message
		}
		list = append(list, item)
	}
	block["connectors"] = list
	return block
}
