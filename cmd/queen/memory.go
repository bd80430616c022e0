package main

import (
	"fmt"
	"os"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/queen-mq/queen/internal/budget"
)

// parseBytes reads a size: a number of bytes, or one with a unit (KiB, MiB,
// GiB, TiB, or KB, MB, GB, TB for powers of ten; B optional).
func parseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := len(t)
	for i > 0 && (t[i-1] < '0' || t[i-1] > '9') {
		i--
	}
	num, unit := strings.TrimSpace(t[:i]), strings.ToUpper(strings.TrimSpace(t[i:]))
	mult := map[string]float64{"": 1, "B": 1,
		"K": 1 << 10, "KIB": 1 << 10, "KB": 1e3, "M": 1 << 20, "MIB": 1 << 20, "MB": 1e6,
		"G": 1 << 30, "GIB": 1 << 30, "GB": 1e9, "T": 1 << 40, "TIB": 1 << 40, "TB": 1e12}[unit]
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || mult == 0 || v < 0 {
		return 0, fmt.Errorf("%q: want a size such as 512MiB or 2GiB", s)
	}
	if v*mult > 1<<62 {
		return 0, fmt.Errorf("%q: too large", s)
	}
	return int64(v * mult), nil
}

// memoryFromSetting reads QUEEN_MEMORY_LIMIT (or the flag's value): unset
// is budget.Default, "off" leaves every size at its own default and the Go
// heap without a limit (a zero budget).
func memoryFromSetting(v string) (budget.Budget, error) {
	v = strings.TrimSpace(v)
	switch strings.ToLower(v) {
	case "":
		return budget.For(budget.Default), nil
	case "off":
		return budget.Budget{}, nil
	}
	n, err := parseBytes(v)
	if err != nil {
		return budget.Budget{}, fmt.Errorf("QUEEN_MEMORY_LIMIT / -memory-limit %w, or off", err)
	}
	if n < budget.Min {
		return budget.Budget{}, fmt.Errorf("QUEEN_MEMORY_LIMIT / -memory-limit %q: want at least 128MiB (or off for Pebble's own sizes and no heap limit)", v)
	}
	return budget.For(n), nil
}

// applyBudget sets the Go heap's soft limit, unless GOMEMLIMIT in the
// environment already decided it. It returns the limit in force.
func applyBudget(b budget.Budget) int64 {
	if b.Limit > 0 && os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(b.GoLimit)
	}
	return debug.SetMemoryLimit(-1)
}

func formatBytes(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", n>>30)
	case n >= 1<<20:
		return fmt.Sprintf("%.0fMiB", float64(n)/(1<<20))
	default:
		return strconv.FormatInt(n, 10) + "B"
	}
}
