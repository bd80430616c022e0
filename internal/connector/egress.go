package connector

import (
	"context"
	"net"
	"net/netip"
	"syscall"
)

// IsPrivateAddr reports whether ip is loopback, private (RFC 1918, RFC
// 4193), link-local, CGNAT (100.64.0.0/10) or unspecified: the addresses
// QUEEN_PG_ALLOW_PRIVATE_NETWORKS=false keeps connectors away from.
func IsPrivateAddr(ip netip.Addr) bool {
	ip = ip.Unmap()
	if ip.IsLoopback() || ip.IsPrivate() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() || ip.IsUnspecified() || ip.IsInterfaceLocalMulticast() {
		return true
	}
	return cgnat.Contains(ip)
}

var cgnat = netip.MustParsePrefix("100.64.0.0/10")

// egressError is the coded error of a refused address.
func egressError(host string, ip netip.Addr) *Error {
	return Errorf("egress", nil, "%s resolves to %s, a loopback, private or link-local address, and QUEEN_PG_ALLOW_PRIVATE_NETWORKS is false; use a public address, or allow private networks on this node", host, ip)
}

// Dial connects like net.Dialer.DialContext, and when allowPrivate is false
// refuses (with code egress) an address that is loopback, private or
// link-local. The check runs on the address actually dialed, after name
// resolution, so a name that resolves differently later cannot slip past
// it. Connectors pass it as their database driver's dial function.
func Dial(allowPrivate bool) func(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &net.Dialer{}
	if !allowPrivate {
		d.Control = func(network, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return Errorf("egress", err, "cannot check the address %s against QUEEN_PG_ALLOW_PRIVATE_NETWORKS", address)
			}
			if IsPrivateAddr(ap.Addr()) {
				return egressError(address, ap.Addr())
			}
			return nil
		}
	}
	return d.DialContext
}

// Dial is Dial(env.AllowPrivateNetworks).
func (e Env) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	return Dial(e.AllowPrivateNetworks)(ctx, network, addr)
}
