#!/usr/bin/perl
# A line-based key-value service on 127.0.0.1:PORT (one client at a time).
use strict;
use warnings;
use IO::Socket::INET;

my $port = shift // 7070;
my $server = IO::Socket::INET->new(
    LocalAddr => '127.0.0.1',
    LocalPort => $port,
    Listen    => 8,
    ReuseAddr => 1,
) or die "cannot listen on 127.0.0.1:$port: $!\n";
my %store;
while (my $client = $server->accept) {
    $client->autoflush(1);
    while (my $line = <$client>) {
        $line =~ s/\r?\n\z//;
        if ($line =~ /\ASET (\S+) (.*)\z/) {
            $store{$1} = $2;
            print $client "OK\n";
        } elsif ($line =~ /\AGET (\S+)\z/) {
            print $client (exists $store{$1} ? "$store{$1}\n" : "NONE\n");
        } elsif ($line eq 'QUIT') {
            last;
        } else {
            print $client "ERR\n";
        }
    }
    close $client;
}
