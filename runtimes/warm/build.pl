# isobox warm-pool harness for compiled runtimes (go, rust, typescript): a sandbox
# booted ahead of time, waiting for one execution. Perl because every root filesystem
# has it (perl-base is part of a minimal Debian); it only waits and then gets out of
# the way: the build and the program run exactly as on the cold path.
#
# isoboxd starts this with `perl -e` in a sandbox whose fd 0 is a socket to isoboxd. It
# sends one frame (a 4-byte big-endian length, then JSON) when it is ready:
#   {"ev":"ready"}
# and isoboxd answers with one frame when a request claims the sandbox, binary rather
# than JSON (no JSON module is in perl-base): a 4-byte big-endian count of files, each
# file a 4-byte length and its name then a 4-byte length and its bytes, then a 4-byte
# count of argv words, each a 4-byte length and the word. The files are written into
# /workspace (0444, like the cold path's read-only binds); then the argv — the cold
# path's own build wrapper (`/bin/sh -c BUILD_SCRIPT ...`) — replaces this process, so
# the wrapper is PID 1 and the program after it, as on a cold run. Reads take exactly
# what they ask for: whatever follows the frame on fd 0 is the program's stdin.
use strict;
use warnings;
use Fcntl qw(O_WRONLY O_CREAT O_EXCL);

sub read_exact {
    my ($n) = @_;
    my $buf = '';
    while (length($buf) < $n) {
        my $r = sysread(STDIN, $buf, $n - length($buf), length($buf));
        exit 0 unless $r;    # isoboxd discarded this sandbox
    }
    return $buf;
}

# The frames go on fd 0 (a socket; stdout is the program's): a second handle on the same
# descriptor, not a copy, kept open until the exec.
open(my $ctl, '>&=', 0) or die "fd 0: $!";

sub send_frame {
    my ($body) = @_;
    my $all = pack('N', length($body)) . $body;
    while (length($all)) {
        my $w = syswrite($ctl, $all) // die "write: $!";
        substr($all, 0, $w) = '';
    }
}

send_frame('{"ev":"ready"}');

my $frame = read_exact(unpack('N', read_exact(4)));
my $pos = 0;
my $take = sub {
    my $n = unpack('N', substr($frame, $pos, 4));
    my $s = substr($frame, $pos + 4, $n);
    $pos += 4 + $n;
    return $s;
};
my $nfiles = unpack('N', substr($frame, $pos, 4));
$pos += 4;
for (1 .. $nfiles) {
    my $name = $take->();
    my $data = $take->();
    # isoboxd validated the names; a second line of defence all the same.
    die "bad name\n" if grep { $_ eq '' || $_ eq '.' || $_ eq '..' } split m{/}, $name, -1;
    my $path = "/workspace/$name";
    my $dir = '/workspace';
    my @parts = split m{/}, $name;
    pop @parts;
    for my $p (@parts) {
        $dir .= "/$p";
        mkdir $dir unless -d $dir;
    }
    sysopen(my $fh, $path, O_WRONLY | O_CREAT | O_EXCL, 0444) or die "$path: $!";
    while (length($data)) {
        my $w = syswrite($fh, $data) // die "$path: $!";
        substr($data, 0, $w) = '';
    }
    close($fh) or die "$path: $!";
}
my $nargs = unpack('N', substr($frame, $pos, 4));
$pos += 4;
my @argv = map { $take->() } 1 .. $nargs;
undef $frame;
exec { $argv[0] } @argv or die "exec $argv[0]: $!";
