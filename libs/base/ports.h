// Ports for servers that restart on the port they had.
//
//   const int port = PickRestartablePort();            // 0 if none was found
//   argv.push_back(absl::StrCat("--listen=127.0.0.1:", port));
//
// A server that binds port 0 gets a port from Linux's ephemeral range
// (/proc/sys/net/ipv4/ip_local_port_range, 32768-60999 by default), where
// any process's outgoing connection may take it while the server is down: a
// restart on the same port then fails with "Address already in use". These
// ports come from below that range, where only explicit binds land.
#ifndef DTRAIN_LIBS_BASE_PORTS_H_
#define DTRAIN_LIBS_BASE_PORTS_H_

namespace dtrain {

// A TCP port on 127.0.0.1 in [20000, 32000) that was free when checked (by
// binding it), chosen at random; 0 if 200 tries found none.
int PickRestartablePort();

}  // namespace dtrain

#endif  // DTRAIN_LIBS_BASE_PORTS_H_
