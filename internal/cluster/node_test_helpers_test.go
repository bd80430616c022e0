package cluster

import (
	etcdraft "go.etcd.io/raft/v3"
)

// proposeRaw puts data in the log as one entry, bypassing the envelope and
// the grouping of Submit.
func (n *Node) proposeRaw(data []byte) error {
	errc := make(chan error, 1)
	n.funcs <- func(rn *etcdraft.RawNode) { errc <- rn.Propose(data) }
	return <-errc
}
