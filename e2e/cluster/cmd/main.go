// Command loom-k8s is one multi-call binary holding a real Kubernetes control plane for
// Loom's tests: kube-apiserver, kube-controller-manager, kube-scheduler and an embedded etcd,
// all built from the official Go modules. It never runs workloads; see e2e/node_agent.
package main

import (
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func usage() {
	fmt.Fprintln(os.Stderr, "usage: loom-k8s etcd|kube-apiserver|kube-controller-manager|kube-scheduler [flags]")
	os.Exit(2)
}

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	name, args := os.Args[1], os.Args[2:]
	os.Args = append([]string{name}, args...)
	switch name {
	case "etcd":
		os.Exit(runEtcd(args))
	case "kube-apiserver":
		cmd := apiserver.NewAPIServerCommand()
		cmd.SetArgs(args)
		if err := cmd.Execute(); err != nil {
			os.Exit(1)
		}
	case "kube-controller-manager":
		cmd := controllermanager.NewControllerManagerCommand()
		cmd.SetArgs(args)
		if err := cmd.Execute(); err != nil {
			os.Exit(1)
		}
	case "kube-scheduler":
		cmd := scheduler.NewSchedulerCommand()
		cmd.SetArgs(args)
		if err := cmd.Execute(); err != nil {
			os.Exit(1)
		}
	default:
		usage()
	}
}

// runEtcd starts a single-member etcd on loopback and serves until SIGTERM or SIGINT.
func runEtcd(args []string) int {
	fs := flag.NewFlagSet("etcd", flag.ExitOnError)
	dir := fs.String("data-dir", "", "etcd data directory")
	client := fs.String("listen-client-url", "http://127.0.0.1:2379", "client URL")
	peer := fs.String("listen-peer-url", "http://127.0.0.1:2380", "peer URL")
	_ = fs.Parse(args)
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "etcd: --data-dir is required")
		return 2
	}
	cu, err := url.Parse(*client)
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcd: bad --listen-client-url:", err)
		return 2
	}
	pu, err := url.Parse(*peer)
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcd: bad --listen-peer-url:", err)
		return 2
	}
	cfg := embed.NewConfig()
	cfg.Name = "loom-e2e"
	cfg.Dir = *dir
	cfg.ListenClientUrls = []url.URL{*cu}
	cfg.AdvertiseClientUrls = []url.URL{*cu}
	cfg.ListenPeerUrls = []url.URL{*pu}
	cfg.AdvertisePeerUrls = []url.URL{*pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = "warn"
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcd: start failed:", err)
		return 1
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
		fmt.Fprintln(os.Stderr, "etcd: ready on", cu.String())
	case <-time.After(60 * time.Second):
		fmt.Fprintln(os.Stderr, "etcd: not ready after 60s")
		return 1
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-stop:
		return 0
	case err := <-e.Err():
		fmt.Fprintln(os.Stderr, "etcd: failed:", err)
		return 1
	}
}
