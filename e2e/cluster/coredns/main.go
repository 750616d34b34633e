// The e2e node's cluster DNS: CoreDNS with only the plugins the node's Corefile uses.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/template"
)

func init() {
	// The order plugins run in, as in CoreDNS's plugin.cfg.
	dnsserver.Directives = []string{"bind", "ready", "errors", "template", "kubernetes"}
}

func main() { coremain.Run() }
