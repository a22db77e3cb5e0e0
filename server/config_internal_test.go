package server

import (
	"strings"
	"testing"
	"time"

	"github.com/participantd/participantd/participant"
)

// The token window flows from Config to the service's options, with the
// skew defaulted, and a negative window or skew is refused by name.
func TestConfig_TokenWindowReachesTheService(t *testing.T) {
	for _, c := range []struct {
		name         string
		cfg          Config
		window, skew time.Duration
	}{
		{"off by default", Config{}, 0, participant.DefaultTokenSkew},
		{"window", Config{TokenWindow: 10 * time.Minute}, 10 * time.Minute, participant.DefaultTokenSkew},
		{"window below skew", Config{TokenWindow: time.Second, TokenSkew: time.Hour}, time.Second, time.Hour},
	} {
		cfg, err := c.cfg.withDefaults()
		if err != nil {
			t.Errorf("%s: withDefaults: %v", c.name, err)
			continue
		}
		o := (&Server{cfg: cfg}).serviceOptions(nil)
		if o.TokenWindow != c.window || o.TokenSkew != c.skew {
			t.Errorf("%s: service options token window %v, skew %v; want %v, %v", c.name, o.TokenWindow, o.TokenSkew, c.window, c.skew)
		}
	}
	for _, c := range []struct {
		cfg  Config
		name string
	}{
		{Config{TokenWindow: -time.Minute}, "token-window"},
		{Config{TokenWindow: time.Microsecond}, "below 1ms"},
		{Config{TokenSkew: -time.Second}, "token-skew"},
		{Config{Retain: -time.Hour}, "retain"},
	} {
		if _, err := c.cfg.withDefaults(); err == nil || !strings.Contains(err.Error(), c.name) {
			t.Errorf("withDefaults(%+v) = %v, want an error naming %s", c.cfg, err, c.name)
		}
	}
}
