/*
 * test_setuid.c -- a privileged program that uses gpuarr takes no path or library from its
 * environment. tests/setuid/setuid_probe (gpuarr_init, gpuarr_shutdown) is copied into a folder
 * of its own, made setuid root and run as nobody (setpriv --reuid=65534) with GPUARR_TRACE naming
 * a file root owns and GPUARR_OPENCL_LIBRARY naming tests/setuid/evil_library.c, whose
 * constructor writes a marker file: the file must stay as it was and the marker must not appear.
 * The same run as plain root, unprivileged by the kernel's measure, shows both variables honoured,
 * so the first check cannot pass for a reason of its own. Needs root (make test runs as root) and
 * setpriv (util-linux); skips, saying why, without them. The make rule gives the two programs'
 * paths as GPUARR_TEST_SETUID_PROBE and GPUARR_TEST_EVIL_LIBRARY.
 */
#include "test_common.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#define VICTIM_TEXT "root's own settings\n"

static char dir[64];

static void remove_dir(void) {
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (dir[0] && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

static void copy_file(const char *from, const char *to, mode_t mode) {
    FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
    cr_assert(in && out, "copy %s to %s", from, to);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0) cr_assert_eq(fwrite(buf, 1, n, out), n, "writing %s", to);
    fclose(in);
    cr_assert_eq(fclose(out), 0, "closing %s", to);
    cr_assert_eq(chown(to, 0, 0), 0, "chown root %s", to);
    cr_assert_eq(chmod(to, mode), 0, "chmod %o %s", (unsigned)mode, to); /* after chown, which clears setuid */
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "write %s", path);
    fputs(text, f);
    cr_assert_eq(fclose(f), 0);
    cr_assert_eq(chmod(path, 0644), 0);
}

/* The whole file (at most 4 KiB), "" when it does not exist. */
static void read_text(const char *path, char *out, size_t cap) {
    out[0] = '\0';
    FILE *f = fopen(path, "r");
    if (!f) return;
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = '\0';
    fclose(f);
}

/* A folder under `parent` that setuid programs can run from and every user can enter. */
static bool make_dir(const char *parent) {
    struct statvfs fs;
    if (statvfs(parent, &fs) != 0 || (fs.f_flag & ST_NOSUID)) return false;
    snprintf(dir, sizeof dir, "%s/gpuarr-test-setuid-XXXXXX", parent);
    cr_assert_not_null(mkdtemp(dir), "mkdtemp under %s", parent);
    cr_assert_eq(chmod(dir, 0755), 0);
    return true;
}

/* Runs argv[0] with exactly the environment env, its output into `log`; the exit status. */
static int run(char *const argv[], char *const env[], const char *log) {
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0) _exit(126);
        execve(argv[0], argv, env);
        _exit(127);
    }
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* The probe with GPUARR_TRACE = victim and GPUARR_OPENCL_LIBRARY = the evil library, as nobody
   through setpriv (as_nobody) or as root; what it printed goes to `out`. */
static int run_probe(bool as_nobody, const char *victim, const char *marker, char *out, size_t cap) {
    char probe[128], library[128], trace[192], opencl[192], mark[192], log[128];
    snprintf(probe, sizeof probe, "%s/setuid_probe", dir);
    snprintf(library, sizeof library, "%s/evil_library.so", dir);
    snprintf(trace, sizeof trace, "GPUARR_TRACE=%s", victim);
    snprintf(opencl, sizeof opencl, "GPUARR_OPENCL_LIBRARY=%s", library);
    snprintf(mark, sizeof mark, "GPUARR_TEST_MARKER=%s", marker);
    snprintf(log, sizeof log, "%s/output", dir);
    char *env[] = {trace, opencl, mark, "GPUARR_LOG=warn", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", NULL};
    char setpriv[] = "/usr/bin/setpriv", reuid[] = "--reuid=65534", regid[] = "--regid=65534", clear[] = "--clear-groups";
    char *nobody[] = {setpriv, reuid, regid, clear, probe, NULL}, *root[] = {probe, NULL};
    int status = run(as_nobody ? nobody : root, env, log);
    read_text(log, out, cap);
    return status;
}

Test(setuid, privileged_program_ignores_path_and_library_variables, .fini = remove_dir) {
    const char *probe = getenv("GPUARR_TEST_SETUID_PROBE"), *library = getenv("GPUARR_TEST_EVIL_LIBRARY");
    if (!probe || !library) test_skip("GPUARR_TEST_SETUID_PROBE and GPUARR_TEST_EVIL_LIBRARY are not set (make run-tests sets them)");
    if (geteuid() != 0) test_skip("not root: a setuid-root copy of the probe cannot be made (make test runs as root)");
    if (access("/usr/bin/setpriv", X_OK) != 0) test_skip("no /usr/bin/setpriv (util-linux) to run the probe as another user");
    if (!make_dir("/tmp") && !make_dir("/var/tmp")) test_skip("/tmp and /var/tmp are mounted nosuid: a setuid program has no effect there");
    char path[128], victim[128], marker[128], out[4096], text[4096];
    snprintf(path, sizeof path, "%s/setuid_probe", dir);
    copy_file(probe, path, 04755);
    snprintf(path, sizeof path, "%s/evil_library.so", dir);
    copy_file(library, path, 0644);

    snprintf(victim, sizeof victim, "%s/victim.conf", dir);
    snprintf(marker, sizeof marker, "%s/marker", dir);
    write_text(victim, VICTIM_TEXT);
    int status = run_probe(true, victim, marker, out, sizeof out);
    cr_assert_eq(status, 0, "the setuid probe failed (exit %d):\n%s", status, out);
    if (!strstr(out, "uid=65534 euid=0\n")) test_skip("the setuid bit took no effect here (no_new_privs?); the probe said:\n%s", out);
    read_text(victim, text, sizeof text);
    cr_expect_str_eq(text, VICTIM_TEXT, "GPUARR_TRACE in a setuid-root program replaced a file root owns with:\n%.300s", text);
    read_text(marker, text, sizeof text);
    cr_expect_str_empty(text, "GPUARR_OPENCL_LIBRARY in a setuid-root program was loaded: its constructor wrote \"%s\"", text);
    cr_expect(strstr(out, "GPUARR_TRACE is ignored") && strstr(out, "GPUARR_OPENCL_LIBRARY is ignored"),
              "no warning names the ignored variables; the probe said:\n%s", out);

    /* the control: root itself, not privileged beyond its user, gets what it asks for */
    snprintf(victim, sizeof victim, "%s/control.conf", dir);
    snprintf(marker, sizeof marker, "%s/control-marker", dir);
    write_text(victim, VICTIM_TEXT);
    status = run_probe(false, victim, marker, out, sizeof out);
    cr_assert_eq(status, 0, "the probe run as root failed (exit %d):\n%s", status, out);
    read_text(victim, text, sizeof text);
    cr_expect(strcmp(text, VICTIM_TEXT) != 0, "GPUARR_TRACE was not honoured in an unprivileged run:\n%s", out);
    read_text(marker, text, sizeof text);
    cr_expect_str_eq(text, "loaded with euid=0\n", "GPUARR_OPENCL_LIBRARY was not loaded in an unprivileged run:\n%s", out);
}
