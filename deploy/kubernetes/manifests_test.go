// Package kubernetes holds the tests of the Kubernetes manifests beside
// it; no cluster is needed. Each manifest decodes strictly into the
// Kubernetes API types (an unknown or misplaced field fails), and the
// participantd container's settings are run through the real daemon
// (participantd --version parses and checks every flag, variable, config
// key and secret file before printing).
package kubernetes

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/participantd/participantd/internal/daemontest"
	"github.com/participantd/participantd/server"
)

// manifest is one file's objects, decoded.
type manifest struct {
	configMaps map[string]*corev1.ConfigMap
	secrets    map[string]*corev1.Secret
	sets       []*appsv1.StatefulSet
	services   []*corev1.Service
	policies   []*networkingv1.NetworkPolicy
}

// decode splits a file into its documents and decodes each strictly into
// the type its apiVersion and kind name.
func decode(t *testing.T, path string) manifest {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m := manifest{configMaps: map[string]*corev1.ConfigMap{}, secrets: map[string]*corev1.Secret{}}
	for i, doc := range regexp.MustCompile(`(?m)^---$`).Split(string(b), -1) {
		var meta struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("%s document %d: %v", path, i, err)
		}
		var obj any
		switch meta.APIVersion + " " + meta.Kind {
		case "v1 ConfigMap":
			obj = &corev1.ConfigMap{}
		case "v1 Secret":
			obj = &corev1.Secret{}
		case "v1 Service":
			obj = &corev1.Service{}
		case "apps/v1 StatefulSet":
			obj = &appsv1.StatefulSet{}
		case "policy/v1 PodDisruptionBudget":
			obj = &policyv1.PodDisruptionBudget{}
		case "networking.k8s.io/v1 NetworkPolicy":
			obj = &networkingv1.NetworkPolicy{}
		default:
			t.Fatalf("%s document %d: unexpected %q %q", path, i, meta.APIVersion, meta.Kind)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			t.Fatalf("%s document %d (%s): %v", path, i, meta.Kind, err)
		}
		switch o := obj.(type) {
		case *corev1.ConfigMap:
			m.configMaps[o.Name] = o
		case *corev1.Secret:
			m.secrets[o.Name] = o
		case *corev1.Service:
			m.services = append(m.services, o)
		case *appsv1.StatefulSet:
			m.sets = append(m.sets, o)
		case *networkingv1.NetworkPolicy:
			m.policies = append(m.policies, o)
		}
	}
	return m
}

func TestDecodeStrict_RefusesUnknownFields(t *testing.T) {
	doc := "apiVersion: apps/v1\nkind: StatefulSet\nspec:\n  replicas: 1\n  terminationGracePeriodSeconds: 30\n"
	if err := yaml.UnmarshalStrict([]byte(doc), &appsv1.StatefulSet{}); err == nil {
		t.Fatal("a misplaced field decoded without an error")
	}
}

func TestSingleNode(t *testing.T) {
	m := decode(t, "single.yaml")
	if len(m.sets) != 1 || *m.sets[0].Spec.Replicas != 1 {
		t.Fatalf("want one StatefulSet of one replica")
	}
	ss := m.sets[0]
	if len(ss.Spec.VolumeClaimTemplates) != 1 {
		t.Errorf("the single node's data needs a volume claim template")
	}
	settings := checkPod(t, m, ss)
	if settings["data"] != "/data" || !mounted(ss, "data", "/data") {
		t.Errorf("data = %q, want /data on the claim's volume", settings["data"])
	}
}

func TestClusterMode(t *testing.T) {
	m := decode(t, "cluster.yaml")
	if len(m.sets) != 1 || *m.sets[0].Spec.Replicas < 3 {
		t.Fatalf("want one StatefulSet of at least three nodes")
	}
	settings := checkPod(t, m, m.sets[0])
	if settings["etcd-endpoints"] == "" {
		t.Errorf("cluster mode without etcd-endpoints")
	}
	if !strings.Contains(settings["advertise"], "."+m.sets[0].Spec.ServiceName+".") {
		t.Errorf("advertise %q does not name the pod in its headless Service %s", settings["advertise"], m.sets[0].Spec.ServiceName)
	}
}

// checkPod checks the participantd container of ss: the probes, the grace
// period, secrets given only as files; then runs the daemon with the
// container's settings (the ConfigMap and Secret written where they are
// mounted, under a temporary root) and returns the resolved settings.
func checkPod(t *testing.T, m manifest, ss *appsv1.StatefulSet) map[string]string {
	t.Helper()
	pod := ss.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("want one container, got %d", len(pod.Containers))
	}
	c := pod.Containers[0]
	root := t.TempDir()

	// Materialize the mounted ConfigMaps and Secrets.
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = v
	}
	for _, vm := range c.VolumeMounts {
		dir := filepath.Join(root, vm.MountPath)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		v, ok := volumes[vm.Name]
		switch {
		case ok && v.ConfigMap != nil:
			cm := m.configMaps[v.ConfigMap.Name]
			if cm == nil {
				t.Fatalf("volume %s names ConfigMap %s, not in the manifest", v.Name, v.ConfigMap.Name)
			}
			for k, val := range cm.Data {
				writeFile(t, filepath.Join(dir, k), strings.ReplaceAll(val, "/etc/participantd/", root+"/etc/participantd/"))
			}
		case ok && v.Secret != nil:
			if s := m.secrets[v.Secret.SecretName]; s != nil {
				for k, val := range s.StringData {
					writeFile(t, filepath.Join(dir, k), val+"\n")
				}
				continue
			}
			// A Secret created at install is not in the manifest: the
			// volume lists its keys (a missing one fails the pod's start),
			// and each is written as `kubectl create secret` would hold it.
			if len(v.Secret.Items) == 0 {
				t.Errorf("volume %s: Secret %s is not in the manifest and lists no items: name the keys it must hold", v.Name, v.Secret.SecretName)
			}
			// The kubelet mounts it with defaultMode, plus group read
			// for fsGroup (the pod's group owns the files then).
			mode := os.FileMode(0o644)
			if v.Secret.DefaultMode != nil {
				mode = os.FileMode(*v.Secret.DefaultMode)
			}
			if sc := pod.SecurityContext; sc != nil && sc.FSGroup != nil {
				mode |= 0o440
			}
			for _, it := range v.Secret.Items {
				p := filepath.Join(dir, it.Path)
				writeFile(t, p, installedSecret(t, it.Key))
				if err := os.Chmod(p, mode); err != nil {
					t.Fatal(err)
				}
			}
		}
	}

	env := map[string]string{}
	var environ []string
	for _, e := range c.Env {
		val := e.Value
		if e.ValueFrom != nil {
			if e.ValueFrom.FieldRef == nil {
				t.Fatalf("env %s: only fieldRef is expected", e.Name)
			}
			val = "field-" + strings.ReplaceAll(e.ValueFrom.FieldRef.FieldPath, ".", "-")
		}
		if e.Name == "PARTICIPANTD_CONFIG" {
			val = root + val
		}
		if strings.HasPrefix(e.Name, "PARTICIPANTD_") && secretName(strings.TrimPrefix(e.Name, "PARTICIPANTD_")) {
			t.Errorf("env %s holds a secret: mount it as a file (-file settings)", e.Name)
		}
		env[e.Name] = val
		environ = append(environ, e.Name+"="+val)
	}
	var args []string
	for _, a := range c.Args {
		a = regexp.MustCompile(`\$\(([A-Z_]+)\)`).ReplaceAllStringFunc(a, func(ref string) string {
			v, ok := env[ref[2:len(ref)-1]]
			if !ok {
				t.Errorf("arg %q refers to an undefined variable %s", a, ref)
			}
			return v
		})
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if secretName(strings.ToUpper(strings.ReplaceAll(name, "-", "_"))) {
			t.Errorf("arg %q holds a secret on the command line: mount it as a file", a)
		}
		args = append(args, a)
	}

	settings := runDaemon(t, args, environ)
	for name, v := range settings {
		if secretName(strings.ToUpper(strings.ReplaceAll(name, "-", "_"))) && v != "" && v != "(redacted)" {
			t.Errorf("%s is given in the clear", name)
		}
	}
	for _, name := range []string{"auth-token-file"} {
		if settings[name] == "" {
			t.Errorf("%s is not set: the wire listener is beyond loopback", name)
		}
	}

	// Probes: /health for liveness, /ready for readiness, on the health
	// listener's port, over HTTPS when it serves TLS.
	_, healthPort, _ := strings.Cut(settings["health-listen"], ":")
	_, wirePort, _ := strings.Cut(settings["listen"], ":")
	scheme := corev1.URISchemeHTTP
	if settings["health-tls-cert"] != "" {
		scheme = corev1.URISchemeHTTPS
	}
	for _, p := range []struct {
		what  string
		probe *corev1.Probe
		path  string
	}{{"liveness", c.LivenessProbe, "/health"}, {"readiness", c.ReadinessProbe, "/ready"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("no %s httpGet probe", p.what)
			continue
		}
		g := p.probe.HTTPGet
		if g.Path != p.path || containerPort(t, c, g.Port) != healthPort || g.Scheme != scheme && !(scheme == corev1.URISchemeHTTP && g.Scheme == "") {
			t.Errorf("%s probe %s %v %s, want %s on the health port %s over %s", p.what, g.Path, g.Port.String(), g.Scheme, p.path, healthPort, scheme)
		}
	}
	if containerPort(t, c, intstr.FromString("wire")) != wirePort {
		t.Errorf("port wire is not the listen port %s", wirePort)
	}
	for _, s := range m.services {
		for _, sp := range s.Spec.Ports {
			containerPort(t, c, sp.TargetPort)
		}
	}

	// The grace period covers the drain and the store's close.
	drain, _ := time.ParseDuration(settings["drain-timeout"])
	closing, _ := time.ParseDuration(settings["store-close-timeout"])
	if g := pod.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second <= drain+closing {
		t.Errorf("terminationGracePeriodSeconds must exceed drain-timeout %v + store-close-timeout %v", drain, closing)
	}
	return settings
}

// secretName says whether an environment variable's name (without the
// prefix) holds a secret, as participantd's secretSetting does.
func secretName(name string) bool {
	switch name[strings.LastIndexByte(name, '_')+1:] {
	case "TOKEN", "PASSWORD", "SECRET":
		return true
	}
	return false
}

// containerPort resolves a probe's or Service's port (a number or a name)
// to the container's port number.
func containerPort(t *testing.T, c corev1.Container, p intstr.IntOrString) string {
	t.Helper()
	if p.Type == intstr.Int {
		return fmt.Sprint(p.IntVal)
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return fmt.Sprint(cp.ContainerPort)
		}
	}
	t.Errorf("port %q is not one of the container's", p.StrVal)
	return ""
}

func mounted(ss *appsv1.StatefulSet, volume, path string) bool {
	for _, vm := range ss.Spec.Template.Spec.Containers[0].VolumeMounts {
		if vm.Name == volume && vm.MountPath == path {
			return true
		}
	}
	return false
}

// installedSecret is what the operator's Secret holds under key, made as
// the manifests' headers say: tokens from `participantd --generate-token`
// (or openssl rand -base64 32), the sealing key from openssl rand -hex 32;
// certificates are read only when serving, not by --version.
func installedSecret(t *testing.T, key string) string {
	t.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	switch {
	case strings.HasSuffix(key, "token") || strings.HasSuffix(key, "password"):
		return base64.StdEncoding.EncodeToString(b) + "\n"
	case strings.HasSuffix(key, "seal-key"):
		return hex.EncodeToString(b) + "\n"
	case strings.HasSuffix(key, ".crt") || strings.HasSuffix(key, ".key"):
		return "-----BEGIN PLACEHOLDER-----\n-----END PLACEHOLDER-----\n"
	}
	t.Fatalf("Secret key %q: unknown kind of secret", key)
	return ""
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// daemon is the participantd binary TestMain builds.
var daemon string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "participantd-k8s")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if daemon, err = daemontest.Build(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// runDaemon runs `participantd --version` with the container's arguments
// and environment: it exits 2 naming any unknown flag, variable or config
// key, invalid value or unreadable secret file. It returns the resolved
// settings.
func runDaemon(t *testing.T, args, environ []string) map[string]string {
	t.Helper()
	cmd := exec.Command(daemon, append(args, "--version")...)
	cmd.Env = environ
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("participantd %s with %s: %v\n%s", strings.Join(args, " "), strings.Join(environ, " "), err, stderr.String())
	}
	return resolved(t, args, environ)
}

// resolved returns the settings the daemon resolves from args, environ and
// the config file PARTICIPANTD_CONFIG names (flag > environment > file >
// default), for the settings this test reads. The daemon has checked them.
func resolved(t *testing.T, args, environ []string) map[string]string {
	t.Helper()
	out := map[string]string{
		"listen": server.DefaultListen, "health-listen": server.DefaultHealthListen,
		"drain-timeout": server.DefaultDrainTimeout.String(), "store-close-timeout": server.DefaultStoreCloseTimeout.String(),
	}
	env := map[string]string{}
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	if path := env["PARTICIPANTD_CONFIG"]; path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			k, v, _ := strings.Cut(line, "=")
			out[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	for k, v := range env {
		if name, ok := strings.CutPrefix(k, "PARTICIPANTD_"); ok && name != "CONFIG" {
			out[strings.ToLower(strings.ReplaceAll(name, "_", "-"))] = v
		}
	}
	for _, a := range args {
		k, v, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		out[k] = v
	}
	return out
}
