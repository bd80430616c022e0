package cluster

import "github.com/hashicorp/raft"

// walRecord is one record of the raft-wal log. raft-wal stores
// hashicorp/raft's log type; this package uses that type as the record
// format only (etcd raft's entries are converted in raftstore.go), nothing
// else of hashicorp/raft.
type walRecord = raft.Log

// walCommand is the record type of every entry this package writes.
const walCommand = raft.LogCommand
