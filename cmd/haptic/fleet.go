// fleet.go owns naming a fleet of agents by one DNS name (--agents-dns):
// every A and AAAA record of the URL's host is one agent, as the pods of a
// Kubernetes headless Service are. The name is resolved once per command,
// with the standard library, so that a push or a fleet read works on one
// fixed list even while pods come and go.

package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"slices"
)

// lookupFunc resolves a host name to its addresses, as
// (*net.Resolver).LookupIPAddr does; stdio carries it so that tests can
// name several loopback agents by one name.
type lookupFunc func(ctx context.Context, host string) ([]net.IPAddr, error)

// fleetURLs resolves the host of dnsURL and returns one agent URL per
// distinct address, in address order (so that a canary is the same pods
// from one push to the next), each with dnsURL's scheme, port and path.
func fleetURLs(ctx context.Context, lookup lookupFunc, dnsURL string) ([]string, error) {
	u, err := url.Parse(dnsURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" {
		return nil, fmt.Errorf("--agents-dns %q is not a URL such as https://haptic-agent.namespace.svc:5555", dnsURL)
	}
	if lookup == nil {
		lookup = net.DefaultResolver.LookupIPAddr
	}
	found, err := lookup(ctx, u.Hostname())
	if err != nil {
		return nil, fmt.Errorf("--agents-dns: %w", err)
	}
	var addrs []netip.Addr
	for _, a := range found {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			addrs = append(addrs, ip.Unmap().WithZone(a.Zone))
		}
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	addrs = slices.Compact(addrs)
	if len(addrs) == 0 {
		return nil, fmt.Errorf("--agents-dns: %s has no A or AAAA record", u.Hostname())
	}
	urls := make([]string, len(addrs))
	for i, a := range addrs {
		pod := *u
		pod.Host = a.String()
		if u.Port() != "" {
			pod.Host = net.JoinHostPort(a.String(), u.Port())
		} else if a.Is6() {
			pod.Host = "[" + a.String() + "]"
		}
		urls[i] = pod.String()
	}
	return urls, nil
}

// fleetTLS is the TLS configuration for the agents behind dnsURL: the
// operator's, with the server name each agent's certificate must carry.
// That is --tls-server-name where given, else the name the operator gave
// (the Service's), never a pod's address, which no certificate lists. nil
// for plain http.
func fleetTLS(cfg *tls.Config, dnsURL string) *tls.Config {
	u, err := url.Parse(dnsURL)
	if err != nil || u.Scheme != "https" {
		return cfg
	}
	if cfg == nil {
		cfg = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	if cfg.ServerName == "" {
		cfg = cfg.Clone()
		cfg.ServerName = u.Hostname()
	}
	return cfg
}

// errFleetTwice refuses a fleet named both ways.
var errFleetTwice = errors.New("--agent and --agents-dns name the fleet two ways; give one")

// fleetFlag registers --agents-dns, the fleet named by DNS, on a command
// that reaches many agents.
func fleetFlag(fs *flag.FlagSet, dnsURL *string) {
	fs.StringVar(dnsURL, "agents-dns", "", "a URL whose host names the fleet, e.g. https://haptic-agent.namespace.svc:5555 (a headless Service): "+
		"each of its A and AAAA records is one agent, resolved once; TLS verifies --tls-server-name, else this host name")
}
