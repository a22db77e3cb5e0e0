package main

import (
	"context"
	"errors"
)

// startupFigure is the time to ready of one data directory size.
type startupFigure struct {
	Conversations int     `json:"conversations"`
	Records       int     `json:"records"`
	FileBytes     int64   `json:"file_bytes"`
	BuildSeconds  float64 `json:"build_seconds"`
	OpenSeconds   float64 `json:"open_seconds"`
	ReadySeconds  float64 `json:"ready_seconds"`
}

func runStartup(ctx context.Context, e *env, f *benchFlags) error {
	return errors.New("not yet")
}
