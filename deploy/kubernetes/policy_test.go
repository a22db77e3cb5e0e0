package kubernetes

import (
	"net"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// TestPolicy holds each manifest to what a deployment copied as shipped
// must not expose (issue 27, docs/DESIGN.md "Deploy defaults and
// guards"): no secret in the manifest, the admin endpoints inside the pod
// unless opted in, the pod's syscall filter and service account token
// off, a NetworkPolicy, and in cluster mode TLS to etcd and a sealed
// cluster secret.
func TestPolicy(t *testing.T) {
	for _, file := range []string{"single.yaml", "cluster.yaml"} {
		t.Run(file, func(t *testing.T) {
			checkPolicy(t, decode(t, file))
		})
	}
}

// checkPolicy reports each thing m breaks of the policy: what the
// manifest says first, then what the daemon resolves from it.
func checkPolicy(t *testing.T, m manifest) {
	t.Helper()
	for name, s := range m.secrets {
		if len(s.Data) > 0 || len(s.StringData) > 0 {
			t.Errorf("Secret %s holds values in the manifest: create it at install (kubectl create secret) and reference it", name)
		}
	}
	for _, ss := range m.sets {
		pod := ss.Spec.Template.Spec
		if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
			t.Errorf("StatefulSet %s: automountServiceAccountToken is not false: participantd needs no Kubernetes API token", ss.Name)
		}
		if pod.SecurityContext == nil || pod.SecurityContext.SeccompProfile == nil ||
			pod.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("StatefulSet %s: the pod's seccompProfile is not RuntimeDefault", ss.Name)
		}
		if pod.SecurityContext == nil || pod.SecurityContext.RunAsNonRoot == nil || !*pod.SecurityContext.RunAsNonRoot {
			t.Errorf("StatefulSet %s: runAsNonRoot is not set", ss.Name)
		}
		for _, c := range pod.Containers {
			sc := c.SecurityContext
			if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
				sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
				sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
				t.Errorf("StatefulSet %s container %s: want allowPrivilegeEscalation false, readOnlyRootFilesystem, capabilities drop ALL", ss.Name, c.Name)
			}
		}
		for _, v := range pod.Volumes {
			if v.Secret != nil && (v.Secret.DefaultMode == nil || *v.Secret.DefaultMode&0o077 != 0) {
				t.Errorf("StatefulSet %s: Secret volume %s is readable beyond its owner (defaultMode)", ss.Name, v.Name)
			}
		}
		settings := checkPod(t, m, ss)

		// The admin endpoints answer inside the pod only.
		if settings["admin-remote"] == "true" {
			t.Errorf("StatefulSet %s: admin-remote = true serves the admin endpoints beyond the pod: keep it an explicit opt-in, not a default", ss.Name)
		}
		_, healthPort, _ := net.SplitHostPort(settings["health-listen"])
		for _, s := range m.services {
			for _, sp := range s.Spec.Ports {
				if containerPort(t, ss.Spec.Template.Spec.Containers[0], sp.TargetPort) == healthPort {
					t.Errorf("Service %s exposes the health listener (port %s): probes and Prometheus reach the pod directly", s.Name, healthPort)
				}
			}
		}

		// A NetworkPolicy selects the pod, limits its ingress and egress,
		// and lets the health port in only from chosen peers.
		np := policyFor(m, ss.Spec.Template.Labels)
		switch {
		case np == nil:
			t.Errorf("StatefulSet %s: no NetworkPolicy selects its pods", ss.Name)
		default:
			if !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) || !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) {
				t.Errorf("NetworkPolicy %s: policyTypes %v, want Ingress and Egress", np.Name, np.Spec.PolicyTypes)
			}
			for _, r := range np.Spec.Ingress {
				for _, p := range r.Ports {
					if p.Port != nil && containerPort(t, ss.Spec.Template.Spec.Containers[0], *p.Port) == healthPort && len(r.From) == 0 {
						t.Errorf("NetworkPolicy %s admits the health port from anywhere: name the monitoring peers", np.Name)
					}
				}
			}
		}

		// Cluster mode: TLS to etcd and a sealed cluster secret.
		if eps := settings["etcd-endpoints"]; eps != "" {
			for _, e := range strings.Split(eps, ",") {
				if !strings.HasPrefix(strings.TrimSpace(e), "https://") {
					t.Errorf("etcd endpoint %s is not https://: the data and the etcd credentials would cross the network in the clear", e)
				}
			}
			if settings["etcd-ca"] == "" {
				t.Errorf("cluster mode without etcd-ca: the etcd servers are not verified")
			}
			if settings["etcd-secret-key-file"] == "" {
				t.Errorf("cluster mode without etcd-secret-key-file: the cluster secret is stored unsealed in etcd")
			}
		}
	}
}

// policyFor returns the NetworkPolicy of m whose pod selector selects
// pods labelled podLabels, or nil.
func policyFor(m manifest, podLabels map[string]string) *networkingv1.NetworkPolicy {
	for _, np := range m.policies {
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err == nil && !sel.Empty() && sel.Matches(labels.Set(podLabels)) {
			return np
		}
	}
	return nil
}
