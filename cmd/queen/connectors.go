package main

import (
	"github.com/queen-mq/queen/internal/connector"
	"github.com/queen-mq/queen/internal/pgsink"
	"github.com/queen-mq/queen/internal/pgsource"
)

// connectorFactories are the connector kinds this binary runs, by kind
// (the runtime in internal/connector imports no connector itself). A kind
// missing here shows as phase error, code unsupported.
func connectorFactories() map[string]connector.Factory {
	return map[string]connector.Factory{
		connector.KindSink:   pgsink.New,
		connector.KindSource: pgsource.New,
	}
}
