package httpapi

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/queen-mq/queen/internal/broker"
)

// Cluster routes (docs/http-api.md, "Cluster"): membership and the cluster's status.
// Join and remove go to the leader from whichever node is asked; they, and
// the state checksums, need an operator token when auth is on (authz.go).

func (s *Server) clusterRoutes(handle func(pattern string, h http.HandlerFunc)) {
	handle("GET /api/v1/cluster", s.handleCluster)
	handle("POST /api/v1/cluster/join", s.handleClusterJoin)
	handle("DELETE /api/v1/cluster/members/{id}", s.handleClusterRemove)
}

// clusterFail answers a membership change that failed: a refusal with its
// code (not logged: a joining node asks again every second while its join
// is pending), anything else as every other failure.
func (s *Server) clusterFail(w http.ResponseWriter, r *http.Request, err error) {
	var be *broker.Error
	if errors.As(err, &be) {
		writeError(w, be)
		return
	}
	s.fail(w, r, err)
}

// GET /api/v1/cluster[?checksum=true]: members (id, raft address,
// suffrage), the leader, term, commit index, and each member's own view
// (applied index, state, ...), asked over the raft port; members that do
// not answer within 2 s (50 s with checksum=true, which reads each whole
// store) are marked reachable: false.
func (s *Server) handleCluster(w http.ResponseWriter, r *http.Request) {
	checksum, e := qBool(r, "checksum")
	if e != nil {
		writeError(w, e)
		return
	}
	if checksum && !s.needOperator(w, r, "checksum=true (the state's checksums, which reveal whether any tenant's data changed)") {
		return
	}
	limit := 5 * time.Second
	if checksum {
		limit = 60 * time.Second
	}
	ctx, cancel := context.WithTimeout(r.Context(), limit)
	defer cancel()
	writeJSON(w, 200, s.b.Cluster(ctx, checksum))
}

type joinBody struct {
	ID      *string `json:"id"`
	Address *string `json:"address"`
}

// POST /api/v1/cluster/join {"id", "address"}: add a voter.
func (s *Server) handleClusterJoin(w http.ResponseWriter, r *http.Request) {
	var b joinBody
	if !s.decode(w, r, &b) {
		return
	}
	if b.ID == nil || *b.ID == "" {
		writeError(w, &broker.Error{Code: "invalid_parameter", Field: "id", Message: "id is required: the joining node's id"})
		return
	}
	if b.Address == nil || *b.Address == "" {
		writeError(w, &broker.Error{Code: "invalid_parameter", Field: "address", Message: "address is required: the joining node's raft host:port"})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	if err := s.b.JoinMember(ctx, *b.ID, *b.Address); err != nil {
		s.clusterFail(w, r, err)
		return
	}
	writeJSON(w, 200, map[string]any{"joined": true, "id": *b.ID, "address": *b.Address})
}

// DELETE /api/v1/cluster/members/{id}: remove a member.
func (s *Server) handleClusterRemove(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	if err := s.b.RemoveMember(ctx, id); err != nil {
		s.clusterFail(w, r, err)
		return
	}
	writeJSON(w, 200, map[string]any{"removed": true, "id": id})
}
