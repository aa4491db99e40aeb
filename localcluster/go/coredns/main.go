// Command coredns is upstream CoreDNS with only the plugins the real node's cluster DNS uses:
// all of them would pull in every cloud provider's SDK and double the build time.
package main

import (
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"

	"github.com/coredns/coredns/coremain"
)

func main() {
	coremain.Run()
}
