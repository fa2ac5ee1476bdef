# isobox warm-pool harness for Ruby runtimes: preloaded (`ruby -r`) in a sandbox booted
# ahead of time, before the runtime's own `-e` launcher runs the program.
#
# fd 0 is a socket to isoboxd. This sends one frame (a 4-byte big-endian length, then
# JSON) when ruby is ready, then blocks for the claim:
#   {"files": [["main.rb", "<base64>"], ...], "argv": ["main.rb", "arg1", ...]}
# writes the files into /workspace (read-only, like the cold path's bind mounts), sets
# ARGV as `ruby -e LAUNCHER main.rb arg1 ...` would have it, and returns: ruby then runs
# the launcher and the program exactly as on the cold path. Reads are unbuffered
# (sysread), so whatever follows the frame on fd 0 is still the program's $stdin.
# One execution per sandbox.
require 'json'

module IsoboxWarm
  CTL = IO.for_fd(0, autoclose: false)

  def self.read_exact(n)
    buf = String.new(encoding: Encoding::BINARY)
    while buf.bytesize < n
      begin
        buf << CTL.sysread(n - buf.bytesize)
      rescue EOFError
        exit!(0) # isoboxd discarded this sandbox
      end
    end
    buf
  end

  def self.send_frame(text)
    data = [text.bytesize].pack('N') + text
    data = data[CTL.syswrite(data)..] until data.empty?
  end

  def self.mkdirs(dir)
    return if dir == '/workspace' || File.directory?(dir)
    mkdirs(File.dirname(dir))
    Dir.mkdir(dir)
  end

  def self.claim
    send_frame('{"ev":"ready"}')
    n = read_exact(4).unpack1('N')
    msg = JSON.parse(read_exact(n).force_encoding(Encoding::UTF_8))
    msg['files'].each do |name, data|
      path = File.join('/workspace', name)
      mkdirs(File.dirname(path))
      File.open(path, File::WRONLY | File::CREAT | File::EXCL | File::BINARY, 0o444) do |f|
        f.write(data.unpack1('m'))
      end
    end
    ARGV.replace(msg['argv'])
  end
end

IsoboxWarm.claim
Object.send(:remove_const, :IsoboxWarm)
