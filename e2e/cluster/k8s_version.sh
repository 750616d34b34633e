# Sourced by build.sh and build_node.sh: the Kubernetes version go.mod requires, and the linker
# flags that stamp it into a binary (kubectl parses the server's version: unstamped, it says
# v0.0.0-master).
K8S_VERSION="$(awk '$1 == "k8s.io/kubernetes" {print $2; exit}' "$here/go.mod")"
minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
K8S_LDFLAGS="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  K8S_LDFLAGS+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  K8S_LDFLAGS+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
