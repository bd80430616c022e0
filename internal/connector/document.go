package connector

import "encoding/json"

// Kinds of connector.
const (
	KindSource = "source"
	KindSink   = "sink"
)

// Document is a connector as stored: what a PUT sent, with defaults filled
// in, and the password replaced by its sealed form.
type Document struct {
	Name       string      `json:"name"`
	Kind       string      `json:"kind"`
	Connection Connection  `json:"connection"`
	Source     *SourceSpec `json:"source,omitempty"`
	Sink       *SinkSpec   `json:"sink,omitempty"`
	// Version grows with every write of the document (the KV version of
	// the key that stores it).
	Version uint64 `json:"version,omitempty"`
	// Deleting is set by a DELETE of a source (with DropSlot true unless
	// ?dropSlot=false): its owner drops the slot (and a managed
	// publication), then calls Env.Remove.
	Deleting bool `json:"deleting,omitempty"`
	// Resync counts POST .../resync calls; a source that sees it grow
	// drops its pointer and slot and starts a new epoch.
	Resync uint64 `json:"resync,omitempty"`
}

// QualifiedName is the connector's name made unique across tenants: the
// name itself in tenant "default", else "<tenant>/<name>". It is the
// progress table's sink column, so two tenants' sinks never share progress
// rows (slots and publications get DefaultSlotName for the same reason).
func QualifiedName(tenant, name string) string {
	if tenant == "" || tenant == "default" {
		return name
	}
	return tenant + "/" + name
}

// Connection says how to reach PostgreSQL. Either URL or the fields.
type Connection struct {
	URL              string `json:"url,omitempty"`
	Host             string `json:"host,omitempty"`
	Port             int    `json:"port,omitempty"`
	Database         string `json:"database,omitempty"`
	User             string `json:"user,omitempty"`
	SSLMode          string `json:"sslMode,omitempty"`
	SSLRootCert      string `json:"sslRootCert,omitempty"`
	ConnectTimeoutMs int    `json:"connectTimeoutMs,omitempty"`
	// SealedPassword is the password sealed with QUEEN_ENCRYPTION_KEY; it
	// is never shown. A read says PasswordSet instead.
	SealedPassword []byte `json:"sealedPassword,omitempty"`
	PasswordSet    bool   `json:"passwordSet"`
}

// SSL modes a connection accepts.
const (
	SSLDisable    = "disable"
	SSLPrefer     = "prefer"
	SSLRequire    = "require"
	SSLVerifyFull = "verify-full"
)

// SourceSpec is the "source" block of a source document.
type SourceSpec struct {
	Tables            []TableSpec `json:"tables"`
	Slot              string      `json:"slot"`
	Publication       string      `json:"publication"`
	ManagePublication *bool       `json:"managePublication"`
	Snapshot          string      `json:"snapshot"`
	SnapshotChunkRows int         `json:"snapshotChunkRows"`
	MaxBundleMessages int         `json:"maxBundleMessages"`
	MaxBundleBytes    int         `json:"maxBundleBytes"`
	LingerMs          int         `json:"lingerMs"`
	HeartbeatSeconds  int         `json:"heartbeatSeconds"`
	OnTruncate        string      `json:"onTruncate"`
}

// TableSpec is one table of a source. PartitionBy is the JSON "key",
// "single" or a list of column names (stored with the default filled in);
// PartitionMode reads it.
type TableSpec struct {
	Table       string          `json:"table"`
	Queue       string          `json:"queue"`
	PartitionBy json.RawMessage `json:"partitionBy,omitempty"`
}

// SinkSpec is the "sink" block of a sink document.
type SinkSpec struct {
	Queue               string            `json:"queue"`
	Table               string            `json:"table"`
	Mode                string            `json:"mode"`
	ConsumerGroup       string            `json:"consumerGroup"`
	SubscriptionMode    string            `json:"subscriptionMode"`
	Key                 []string          `json:"key,omitempty"`
	Statement           string            `json:"statement,omitempty"`
	Params              []string          `json:"params,omitempty"`
	Metadata            map[string]string `json:"metadata,omitempty"`
	Batch               int               `json:"batch"`
	Workers             int               `json:"workers"`
	LeaseSeconds        int               `json:"leaseSeconds"`
	MaxAttempts         int               `json:"maxAttempts"`
	ProgressTable       string            `json:"progressTable"`
	CreateProgressTable *bool             `json:"createProgressTable"`
}

// Sink modes.
const (
	ModeAppend = "append"
	ModeUpsert = "upsert"
	ModeCDC    = "cdc"
	ModeSQL    = "sql"
)

// Metadata facts a sink can write into columns (SinkSpec.Metadata keys).
var MetadataFacts = []string{"partition", "partitionId", "offset", "transactionId", "createdAt", "payload"}
