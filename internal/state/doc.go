// Package state owns the broker's replicated state: the Pebble key layout, the
// encodings of every record, the commands that change state and their
// deterministic Apply, and the read queries the broker answers from.
//
// Nothing in this package reads a clock, draws random numbers or depends on map
// order: applying the same entries to two empty stores yields identical keys and
// values. See docs/design/state.md for the layout and the decisions behind it.
//
// A storage error or an undecodable record inside Apply halts the store
// (fault.go, docs/design/durability.md): it never guesses.
package state
