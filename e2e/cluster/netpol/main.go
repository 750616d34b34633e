// Command loom-netpol enforces NetworkPolicies on Loom's e2e node: the NetworkPolicy controller of
// sigs.k8s.io/kube-network-policies (nftables + NFQUEUE), run as a host process beside the kubelet.
//
// It is upstream's cmd/main.go of the same release less the AdminNetworkPolicy APIs, with two
// changes a host process needs: the API server comes from --kubeconfig (upstream reads the
// in-cluster ServiceAccount files, which only a pod has), and SIGTERM, not only SIGINT, makes it
// delete its nftables table on the way out. build_netpol.sh builds it with one file of
// github.com/google/nftables swapped (_nftables/expr/queue.go: the kernel here has no nftables
// queue expression, so the queue rule goes through nft_compat).
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sys/unix"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"sigs.k8s.io/kube-network-policies/pkg/networkpolicy"
)

func main() {
	os.Exit(run())
}

func run() int {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the cluster's API server (required)")
	nodeName := flag.String("hostname-override", "", "the name of this node (required)")
	queueID := flag.Int("nfqueue-id", 100, "the NFQUEUE number connections' first packets go to")
	metrics := flag.String("metrics-bind-address", "127.0.0.1:9080", "where /metrics is served")
	bug1766 := flag.Bool("netfilter-bug-1766-fix", false,
		"queue DNS on PREROUTING too (only kernels before 6.12 need it)")
	klog.InitFlags(flag.CommandLine)
	flag.Parse()
	if *kubeconfig == "" || *nodeName == "" {
		fmt.Fprintln(os.Stderr, "usage: loom-netpol --kubeconfig FILE --hostname-override NODE [flags]")
		return 2
	}
	if _, _, err := net.SplitHostPort(*metrics); err != nil {
		fmt.Fprintf(os.Stderr, "--metrics-bind-address %q: %v\n", *metrics, err)
		return 2
	}
	ctx, cancel := signal.NotifyContext(context.Background(), unix.SIGINT, unix.SIGTERM)
	defer cancel()

	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		klog.ErrorS(err, "reading the kubeconfig", "path", *kubeconfig)
		return 1
	}
	config.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	config.ContentType = "application/vnd.kubernetes.protobuf"
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		klog.ErrorS(err, "creating the API client")
		return 1
	}
	factory := informers.NewSharedInformerFactory(client, 0)

	http.Handle("/metrics", promhttp.Handler())
	go func() { utilruntime.HandleError(http.ListenAndServe(*metrics, nil)) }()

	controller, err := networkpolicy.NewController(
		client,
		factory.Networking().V1().NetworkPolicies(),
		factory.Core().V1().Namespaces(),
		factory.Core().V1().Pods(),
		nil, nil, nil, nil, // no nodes or AdminNetworkPolicy APIs
		networkpolicy.Config{QueueID: *queueID, NodeName: *nodeName, NetfilterBug1766Fix: *bug1766},
	)
	if err != nil {
		klog.ErrorS(err, "creating the network policy controller")
		return 1
	}
	stopped := make(chan error, 1)
	go func() { stopped <- controller.Run(ctx) }() // deletes its nftables table when ctx ends
	factory.Start(ctx.Done())
	select {
	case err := <-stopped: // the nfqueue could not be opened, or the caches never synced
		klog.ErrorS(err, "network policy controller stopped")
		return 1
	case <-ctx.Done():
	}
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		klog.InfoS("network policy controller did not stop within 5 s")
	}
	return 0
}
