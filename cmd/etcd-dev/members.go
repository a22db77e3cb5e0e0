package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/participantd/participantd/internal/freeport"
)

// layoutFile records, in the data directory, the addresses its members
// were created with. An etcd member's peer address is part of the cluster's
// membership, kept in its log: a member restarted on other ports cannot
// reach the others, and the cluster never regains a quorum. So a second
// run reads the layout back and listens where the first one did.
const layoutFile = "etcd-dev.json"

// layout is the content of layoutFile.
type layout struct {
	// Token is the initial cluster token the members were created with.
	Token   string         `json:"token"`
	Members []memberLayout `json:"members"`
}

type memberLayout struct {
	Name   string `json:"name"`
	Client string `json:"client"` // client URL, http://127.0.0.1:port
	Peer   string `json:"peer"`   // peer URL
}

// readyTimeout bounds how long the members may take to elect a leader.
const readyTimeout = 30 * time.Second

// loadOrCreateLayout returns the layout recorded in dir, existing true, or
// a new one for n members on free loopback ports, recorded before any
// member writes data. A recorded layout of another size is an error: the
// members' data holds the old membership.
func loadOrCreateLayout(dir string, n int) (l layout, existing bool, err error) {
	path := filepath.Join(dir, layoutFile)
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		if err := json.Unmarshal(b, &l); err != nil {
			return layout{}, false, fmt.Errorf("%s: %w (remove %s to start a new cluster)", path, err, dir)
		}
		if len(l.Members) != n {
			return layout{}, false, fmt.Errorf("%s was created with %d members, not %d: give --members %d, or remove %s to start a new cluster",
				dir, len(l.Members), n, len(l.Members), dir)
		}
		return l, true, nil
	case !errors.Is(err, fs.ErrNotExist):
		return layout{}, false, err
	}
	if entries, err := os.ReadDir(dir); err != nil {
		return layout{}, false, err
	} else if len(entries) > 0 {
		return layout{}, false, fmt.Errorf("%s holds data but no %s (made by an older etcd-dev?): remove it to start a new cluster", dir, layoutFile)
	}
	ports, err := freePorts(2 * n)
	if err != nil {
		return layout{}, false, err
	}
	l.Token = fmt.Sprintf("etcd-dev-%d", time.Now().UnixNano())
	for i := range n {
		l.Members = append(l.Members, memberLayout{
			Name:   fmt.Sprintf("m%d", i),
			Client: fmt.Sprintf("http://127.0.0.1:%d", ports[2*i]),
			Peer:   fmt.Sprintf("http://127.0.0.1:%d", ports[2*i+1]),
		})
	}
	b, err = json.MarshalIndent(l, "", "  ")
	if err != nil {
		return layout{}, false, err
	}
	// The layout must be durable before any member's data exists: data
	// without it cannot be restarted.
	return l, false, writeFileSync(path, append(b, '\n'))
}

// startMembers starts every member of l with its data under dir and waits
// until each is ready (a leader elected). It returns the running members;
// on error none is left running.
func startMembers(dir string, l layout, existing bool, logLevel string) ([]*embed.Etcd, error) {
	var initial []string
	for _, m := range l.Members {
		initial = append(initial, m.Name+"="+m.Peer)
	}
	state := embed.ClusterStateFlagNew
	if existing {
		state = embed.ClusterStateFlagExisting
	}
	var started []*embed.Etcd
	closeAll := func() {
		for _, e := range started {
			e.Close()
		}
	}
	// Members wait for each other to elect a leader: start them all, then
	// wait for each.
	for _, m := range l.Members {
		cu, err := url.Parse(m.Client)
		if err != nil {
			closeAll()
			return nil, err
		}
		pu, err := url.Parse(m.Peer)
		if err != nil {
			closeAll()
			return nil, err
		}
		cfg := embed.NewConfig()
		cfg.Name = m.Name
		cfg.Dir = filepath.Join(dir, m.Name)
		cfg.ListenClientUrls = []url.URL{*cu}
		cfg.AdvertiseClientUrls = []url.URL{*cu}
		cfg.ListenPeerUrls = []url.URL{*pu}
		cfg.AdvertisePeerUrls = []url.URL{*pu}
		cfg.InitialCluster = strings.Join(initial, ",")
		cfg.InitialClusterToken = l.Token
		cfg.ClusterState = state
		cfg.Logger = "zap"
		if logLevel == "" {
			cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
		} else {
			cfg.LogLevel = logLevel
		}
		cfg.ListenMetricsUrls = nil
		e, err := embed.StartEtcd(cfg)
		if err != nil {
			closeAll()
			if isAddrInUse(err) {
				return nil, fmt.Errorf("%s: %s or %s is taken; this data directory's members listen there (%s): free the port, or remove %s to start a new cluster",
					m.Name, m.Client, m.Peer, layoutFile, dir)
			}
			return nil, fmt.Errorf("start %s: %w", m.Name, err)
		}
		started = append(started, e)
	}
	deadline := time.After(readyTimeout)
	for i, e := range started {
		select {
		case <-e.Server.ReadyNotify():
		case err := <-e.Err():
			closeAll()
			return nil, fmt.Errorf("%s: %w", l.Members[i].Name, err)
		case <-deadline:
			closeAll()
			return nil, fmt.Errorf("%s did not become ready within %v (no quorum; --log-level info says why)", l.Members[i].Name, readyTimeout)
		}
	}
	return started, nil
}

func isAddrInUse(err error) bool {
	return strings.Contains(err.Error(), "address already in use")
}

// freePorts returns n distinct loopback ports that were free a moment
// ago, below the ephemeral range where it can (freeport).
func freePorts(n int) ([]int, error) {
	ports, err := freeport.Ports(n)
	if err != nil {
		return nil, fmt.Errorf("free port: %w", err)
	}
	return ports, nil
}

// writeFileSync writes path through a temporary file, synced and renamed,
// then syncs the directory.
func writeFileSync(path string, b []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
