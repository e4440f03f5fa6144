// Command fkmat is the CLI and daemon: it parses flags, environment and the
// configuration file, wires the components of package fkmat together and
// handles signals. It holds no logic of its own; one file per subcommand.
package main
