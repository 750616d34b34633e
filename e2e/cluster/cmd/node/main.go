// Command loom-node is one multi-call binary holding the real node agents of Loom's e2e node:
// the kubelet and kube-proxy, built from the same k8s.io/kubernetes module as loom-k8s.
package main

import (
	"context"
	"fmt"
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client metrics, as upstream's mains
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: loom-node kubelet|kube-proxy [flags]")
		os.Exit(2)
	}
	name, args := os.Args[1], os.Args[2:]
	os.Args = append([]string{name}, args...)
	switch name {
	case "kubelet":
		cmd := kubelet.NewKubeletCommand(context.Background())
		cmd.SetArgs(args)
		os.Exit(cli.Run(cmd))
	case "kube-proxy":
		cmd := proxy.NewProxyCommand()
		cmd.SetArgs(args)
		os.Exit(cli.Run(cmd))
	default:
		fmt.Fprintln(os.Stderr, "usage: loom-node kubelet|kube-proxy [flags]")
		os.Exit(2)
	}
}
